"""templates/_pagination.html, the newer/older links of the list pages (ramps, webhooks'
deliveries, shadow, evals and conformance runs): the links keep the page's other query
parameters (its filters) and nothing shows for a single page."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.template.loader import render_to_string
from django.test import RequestFactory


def render(query: str, items: int, per_page: int = 10, **extra: str) -> str:
    request = RequestFactory().get(f"/ramps/?{query}")
    page = Paginator(list(range(items)), per_page).get_page(request.GET.get("page"))
    return render_to_string("_pagination.html", {"page": page, **extra}, request=request)


def test_a_middle_page_links_both_ways_keeping_the_filters() -> None:
    html = render("state=running&pool=cand&page=2", 35)
    assert 'href="?state=running&amp;pool=cand&amp;page=1" rel="prev">‹ newer</a>' in html
    assert 'href="?state=running&amp;pool=cand&amp;page=3" rel="next">older ›</a>' in html
    assert "page 2 of 4" in html and 'aria-label="Pages"' in html


def test_the_first_and_last_pages_link_one_way_only() -> None:
    first, last = render("page=1", 25), render("page=3", 25)
    assert 'rel="next"' in first and 'rel="prev"' not in first
    assert 'rel="prev"' in last and 'rel="next"' not in last


def test_one_page_shows_nothing_and_a_label_names_the_list() -> None:
    assert render("", 10).strip() == ""
    assert 'aria-label="Pages of ramps"' in render("page=2", 25, label="Pages of ramps")


def test_a_list_in_order_names_its_links_and_can_keep_an_anchor() -> None:
    html = render("direction=regressed&page=2", 35, previous="‹ previous", next="next ›",
                  anchor="#diff")
    assert 'href="?direction=regressed&amp;page=1#diff" rel="prev">‹ previous</a>' in html
    assert 'href="?direction=regressed&amp;page=3#diff" rel="next">next ›</a>' in html
