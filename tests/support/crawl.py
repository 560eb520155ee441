"""A page walk over real HTTP: sign in through the login form as a person, then follow every
same-site link (GET only) from the navigation, the htmx polls of each page (asked for as
htmx asks, with its headers), each filter form (submitted with its first choices) and the
API's own links, and record each answer.

Bounded so that a list with a thousand rows or a paginated table costs a few requests, not
a thousand: every view answers for at most `per_view` different paths, and for a few query
shapes (the set of parameter names) with one address each (`?page=2` is followed, `?page=3`
is of the same shape). Downloads (a link with `download`, an export) are read to their first
megabyte, so an export that fails while it streams (after its 200) counts as failing too.

The API is walked from its root: each list endpoint the root names, and the first object
of each list by the endpoint's lookup field (so `/api/v1/pools/h200-us-east/`, not a guess).
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit

import httpx
from django.urls import Resolver404, resolve

# Not pages: static files (no database behind them), signing out (a POST form anyway, and it
# would end the walk) and the Django admin (people and roles live on /people/).
SKIP_PREFIXES = ("/static/", "/logout/", "/admin/")
DOWNLOAD_HINTS = ("/download/", "/export/", "export.csv", ".jsonl", ".csv")
DOWNLOAD_READ_BYTES = 1 << 20
API_ROOT = "/api/v1/"


@dataclass(frozen=True)
class Link:
    url: str  # path and query, same site
    hx_target: str = ""  # set for an htmx poll: the element it swaps
    download: bool = False


@dataclass
class Answer:
    url: str
    status: int
    seconds: float
    hx_target: str = ""
    # Set for a failure (a 5xx, or a body that broke off): what the server logged, else the
    # start of the body or how the stream broke.
    error: str = ""


@dataclass
class Walk:
    """One person's walk: every answer, in the order asked."""

    username: str
    answers: list[Answer] = field(default_factory=list)
    truncated: bool = False

    @property
    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status >= 500 or a.error]

    def views(self) -> Counter[str]:
        return Counter(view_key(a.url) for a in self.answers)


def view_key(url: str) -> str:
    """The view that answers `url` ("fleet:pool-detail"), or the path when none does."""
    path = urlsplit(url).path
    try:
        match = resolve(path)
    except Resolver404:
        return path
    return match.view_name or match._func_path


class _Links(HTMLParser):
    """Links, htmx polls, and each GET form (a filter) as the address it submits with every
    list set to its first real choice: the filters' queries run too, not only the lists."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str, bool]] = []  # (href, hx target, download)
        self.form: tuple[str, list[tuple[str, str]]] | None = None  # (action, fields)
        self.select: str | None = None  # a list whose first real choice is not taken yet

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {name: value or "" for name, value in attrs}
        if tag == "a" and attr.get("href"):
            self.found.append((attr["href"], "", "download" in attr))
        if attr.get("hx-get"):
            target = attr.get("hx-target", "").lstrip("#") or attr.get("id", "")
            self.found.append((attr["hx-get"], target or tag, False))
        if tag == "form" and attr.get("method", "get").lower() == "get":
            self.form = (attr.get("action", ""), [])
        if self.form is None or "disabled" in attr:
            return
        if tag == "input" and attr.get("type") == "hidden" and attr.get("name"):
            self.form[1].append((attr["name"], attr.get("value", "")))
        elif tag == "select" and attr.get("name"):
            self.select = attr["name"]
        elif tag == "option" and self.select and attr.get("value"):
            self.form[1].append((self.select, attr["value"]))
            self.select = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.select = None
        elif tag == "form" and self.form is not None:
            action, fields = self.form
            if fields:
                self.found.append((f"{action}?{urlencode(fields)}", "", False))
            self.form = None


class _Bounds:
    """Which links one walk still follows: a view's first `per_view` paths (`per_download`
    for a download), and of each view at most `shapes_per_view` query shapes (the set of
    parameter names; an htmx poll's target is part of its shape), one address each."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.paths: dict[str, set[str]] = {}
        self.shapes: dict[str, set[tuple[str, frozenset[str]]]] = {}

    def admit(self, link: Link) -> bool:
        parts = urlsplit(link.url)
        view = view_key(link.url)
        paths = self.paths.setdefault(view, set())
        most = self.crawler.per_download if link.download else self.crawler.per_view
        if parts.path not in paths and len(paths) >= most:
            return False
        shapes = self.shapes.setdefault(view, set())
        shape = (link.hx_target, frozenset(key for key, _ in parse_qsl(parts.query)))
        if (parts.query or link.hx_target) and (
                shape in shapes or len(shapes) >= self.crawler.shapes_per_view):
            return False
        paths.add(parts.path)
        if parts.query or link.hx_target:
            shapes.add(shape)
        return True


class Crawler:
    def __init__(self, base_url: str, *, per_view: int = 6, per_download: int = 2,
                 shapes_per_view: int = 4, limit: int = 600, timeout_s: float = 60,
                 explain: Callable[[str], str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.host = urlsplit(self.base_url).netloc
        self.per_view = per_view
        self.per_download = per_download
        self.shapes_per_view = shapes_per_view
        self.limit = limit
        self.timeout_s = timeout_s
        # explain(path) -> the server's own account of a 5xx (its log), when it has one.
        self.explain = explain

    # -- signing in ------------------------------------------------------------------------

    def sign_in(self, username: str, password: str) -> httpx.Client:
        """A client holding the session the login form gives `username`."""
        client = httpx.Client(base_url=self.base_url, timeout=self.timeout_s,
                              follow_redirects=False)
        form = client.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert form.status_code == 200 and token, f"no login form at {self.base_url}/login/"
        done = client.post("/login/", data={"username": username, "password": password,
                                            "csrfmiddlewaretoken": token.group(1)},
                           headers={"Referer": f"{self.base_url}/login/"})
        assert done.status_code == 302, (
            f"signing in as {username} answered {done.status_code}, not a redirect: "
            f"{done.text[:300]}")
        return client

    # -- walking ---------------------------------------------------------------------------

    def walk(self, username: str, password: str, *, start: tuple[str, ...] = ("/", API_ROOT)
             ) -> Walk:
        walk = Walk(username=username)
        client = self.sign_in(username, password)
        bounds = _Bounds(self)
        try:
            queue: deque[Link] = deque(Link(url) for url in start)
            seen: set[tuple[str, str]] = set()
            while queue:
                link = queue.popleft()
                if (link.url, link.hx_target) in seen or not bounds.admit(link):
                    continue
                seen.add((link.url, link.hx_target))
                if len(walk.answers) >= self.limit:
                    walk.truncated = True
                    break
                answer, found = self._visit(client, link)
                walk.answers.append(answer)
                queue.extend(found)
        finally:
            client.close()
        return walk

    def _visit(self, client: httpx.Client, link: Link) -> tuple[Answer, list[Link]]:
        headers = {}
        if link.hx_target:
            headers = {"HX-Request": "true", "HX-Target": link.hx_target,
                       "HX-Current-URL": f"{self.base_url}{link.url}"}
        started = time.monotonic()
        broke = ""
        with client.stream("GET", link.url, headers=headers) as response:
            content_type = response.headers.get("content-type", "")
            try:
                body = _read(response, limit=DOWNLOAD_READ_BYTES if link.download else None)
            except httpx.HTTPError as exc:  # a streamed body that broke off after its 200
                body, broke = b"", f"the body broke off: {exc!r}"
        answer = Answer(url=link.url, status=response.status_code,
                        seconds=time.monotonic() - started, hx_target=link.hx_target)
        if response.status_code >= 500 or broke:
            logged = self.explain(urlsplit(link.url).path) if self.explain else ""
            answer.error = logged or broke or body[:300].decode(errors="replace")
            return answer, []
        if response.status_code >= 300 or link.download or not body:
            return answer, []
        text = body.decode(errors="replace")
        if "json" in content_type:
            return answer, self._api_links(link.url, text)
        if "html" in content_type:
            return answer, self._page_links(link.url, text)
        return answer, []

    def _same_site(self, page: str, href: str) -> str | None:
        absolute = urljoin(f"{self.base_url}{page}", href)
        parts = urlsplit(absolute)
        if parts.scheme not in ("http", "https") or parts.netloc != self.host:
            return None
        url = parts.path + (f"?{parts.query}" if parts.query else "")
        return None if url.startswith(SKIP_PREFIXES) else url

    def _page_links(self, page: str, html: str) -> list[Link]:
        parser = _Links()
        parser.feed(html)
        links = []
        for href, target, download in parser.found:
            url = self._same_site(page, href)
            if url is not None:
                download = download or any(hint in url for hint in DOWNLOAD_HINTS)
                links.append(Link(url, target, download))
        return links

    def _api_links(self, page: str, text: str) -> list[Link]:
        """The API's links: URLs it names (the root's endpoints, `next`), and the first
        object of a list by its endpoint's lookup field."""
        import json

        try:
            data = json.loads(text)
        except ValueError:
            return []
        links = [Link(url, download=any(hint in url for hint in DOWNLOAD_HINTS))
                 for value in _strings(data)
                 if value.startswith((self.base_url, API_ROOT))
                 and (url := self._same_site(page, value)) is not None]
        rows = data.get("results") if isinstance(data, dict) else data
        if isinstance(rows, list) and rows and isinstance(rows[0], dict):
            lookup = _lookup_field(page)
            value = rows[0].get(lookup) if lookup else None
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                links.append(Link(f"{urlsplit(page).path}{value}/"))
        return links


def _read(response: httpx.Response, *, limit: int | None) -> bytes:
    """The body, or its first `limit` bytes (a download is read far enough to see that it
    streams, not to its end)."""
    if limit is None:
        return response.read()
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)


def _strings(data: Any) -> list[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [s for value in data.values() for s in _strings(value)]
    if isinstance(data, list):
        return [s for value in data[:50] for s in _strings(value)]
    return []


def _lookup_field(url: str) -> str | None:
    """The field a DRF list endpoint's objects are addressed by ("id" for the primary key),
    or None when `url` is not a list endpoint."""
    try:
        match = resolve(urlsplit(url).path)
    except Resolver404:
        return None
    view = match.func
    actions = getattr(view, "actions", None) or {}
    if actions.get("get") != "list":
        return None
    lookup = getattr(view.cls, "lookup_field", "pk")  # type: ignore[attr-defined]
    return "id" if lookup == "pk" else str(lookup)


def report(walks: list[Walk]) -> str:
    """Every failing address with its error, for an assertion's message."""
    lines = []
    for walk in walks:
        for answer in walk.failures:
            poll = f" (htmx, target {answer.hx_target})" if answer.hx_target else ""
            lines.append(f"{walk.username}: GET {answer.url}{poll} -> {answer.status}\n"
                         f"    {answer.error.strip()}")
        if walk.truncated:
            lines.append(f"{walk.username}: the walk stopped at its limit of "
                         f"{len(walk.answers)} requests")
    return "\n".join(lines)


@contextmanager
def errors_logged() -> Iterator[Callable[[str], str]]:
    """For a server in this process (pytest-django's live_server): what Django logged of each
    500 ("Internal Server Error: <path>" with its exception), as `explain(path)`."""
    logged: dict[str, str] = {}

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            request = getattr(record, "request", None)
            if record.exc_info and request is not None:
                frames = [frame for frame in traceback.extract_tb(record.exc_info[2])
                          if "site-packages" not in frame.filename]
                where = (f'File "{frames[-1].filename}", line {frames[-1].lineno}, in '
                         f"{frames[-1].name}" if frames else "")
                error = traceback.format_exception_only(*record.exc_info[:2])[-1].strip()
                logged[request.path] = f"{where}\n    {error}"

    handler = Keep(level=logging.ERROR)
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        yield lambda path: logged.get(path, "")
    finally:
        logger.removeHandler(handler)
