"""The drain and restore pages say which ramp holds a pool before anyone confirms: a drain
ends that ramp (aborted by the drain), and its restore gives back every share but the
ramp's."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.ramps.models import Ramp
from fleetctl.traffic import push, selectors
from fleetctl.traffic.models import Drain, Route
from tests.ramps.web.conftest import make_ramp

pytestmark = pytest.mark.django_db


def test_the_drain_form_says_which_ramp_holds_the_pool_and_that_draining_ends_it(
        oncall: Client, route: Route):
    held = make_ramp(route, state="paused", step_index=1)

    for url in (reverse("traffic:pool-drain", args=["mi300x-us"]),
                reverse("traffic:route-drain", args=["llama"])):
        html = oncall.get(url).content.decode()
        assert (f'<a href="/ramps/{held.pk}/">Ramp {held.pk}</a> holds mi300x-us on route '
                f'llama</strong> (paused at 5 %)') in html, url
        assert "Draining it ends that ramp: it is aborted by this drain" in html

    other = oncall.get(reverse("traffic:pool-drain", args=["h200-us"])).content.decode()
    assert f"Ramp {held.pk}</a> holds" not in other  # its pool stays on the route


def test_a_drain_from_the_form_aborts_the_ramp_and_the_restore_form_keeps_its_share_off(
        oncall: Client, route: Route):
    held = make_ramp(route, state="paused", step_index=1)
    oncall.post(reverse("traffic:pool-drain", args=["mi300x-us"]),
                {"confirm_name": "mi300x-us", "reason": "flaky"})
    drain = Drain.objects.get()
    held.refresh_from_db()
    assert (held.state, held.drain_id) == (Ramp.State.ABORTED, drain.pk)
    push.drain_progress(drain_id=drain.pk)

    page = oncall.get(reverse("traffic:drain-detail", args=[drain.pk])).content.decode()
    assert "Ramps ended" in page and f"ramp {held.pk}</a> of mi300x-us (aborted at 5 %" in page

    url = reverse("traffic:drain-restore", args=[drain.pk])
    form = oncall.get(url).content.decode()
    assert "stays as drained" in form
    assert (f'<a href="/ramps/{held.pk}/">Ramp {held.pk}</a> held mi300x-us here (aborted at '
            f'5 % (drain {drain.pk})): its 5 % is not restored.') in form

    refused = oncall.post(url, {"reason": "looks fine"})
    assert refused.status_code == 409
    assert "Nothing to restore: mi300x-us&#x27;s share of route llama was held by" in \
        refused.content.decode()
    assert selectors.revision_current(route=Route.objects.get(pk=route.pk)).weights == {
        "h200-us": 10_000}
