from typing import Any

from rest_framework import exceptions
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class Pagination(PageNumberPagination):
    """Page numbers and sizes that cannot be read are a 400 naming the parameter and what it
    takes (DRF would use the default size, or answer 404, without saying why). A page past
    the last one is still a 404: it names no page that exists."""

    page_size_query_param = "page_size"
    max_page_size = 500
    invalid_page_message = "Page {page_number} does not exist: {message}"

    def get_page_size(self, request: Request) -> int | None:
        raw = request.query_params.get(self.page_size_query_param, "")
        if raw == "":
            return self.page_size
        if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= self.max_page_size):
            raise exceptions.ValidationError({self.page_size_query_param: [
                f"“{raw}” is not a page size; allowed: a whole number from 1 to "
                f"{self.max_page_size} (default {self.page_size})."]})
        return int(raw)

    def get_page_number(self, request: Request, paginator: Any) -> Any:
        raw = request.query_params.get(self.page_query_param, "")
        if raw == "" or raw in self.last_page_strings:
            return super().get_page_number(request, paginator)
        if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
            raise exceptions.ValidationError({self.page_query_param: [
                f"“{raw}” is not a page number; allowed: a whole number from 1, or "
                f"{', '.join(self.last_page_strings)}."]})
        return raw
