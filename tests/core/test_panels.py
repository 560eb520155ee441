"""Slots and figure providers (fleetctl/core/panels.py): a lower page renders what the apps
above it registered, in order, when it applies, without naming them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.template import Context, Engine

from fleetctl.core import panels as registry
from fleetctl.core.panels import Panel, register_panel, register_provider
from migrations_plan.panels import GATE_ACTION, PLAN_PANELS, gate_action

TEMPLATES = {
    "page.html": '{% load panels %}<main>{% panels "test.slot" %}</main>{{ note|default:"-" }}',
    "a.html": "[a {{ plan }}]",
    "b.html": "[b {{ note }}]",
    "c.html": "[c]",
    "gate.html": '{% load panels %}{% for check in checks %}{{ check.key }}:'
                 '{% panels "plan.gate_action" %};{% endfor %}',
    "conformance.html": "C",
    "evals.html": "E",
    "live.html": '{% load panels %}{% provided "live" pools as live %}'
                 '{% for p in pools %}{{ p }}={{ live|item:p|default:"—" }} {% endfor %}',
}


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setattr(registry, "PANELS", {})
    monkeypatch.setattr(registry, "PROVIDERS", {})
    return Engine(loaders=[("django.template.loaders.locmem.Loader", TEMPLATES)],
                  libraries={"panels": "fleetctl.core.templatetags.panels"})


def render(engine: Engine, name: str, **context: object) -> str:
    return engine.get_template(name).render(Context(context))


def test_an_empty_slot_renders_nothing(engine: Engine):
    assert render(engine, "page.html", plan="p") == "<main></main>-"


def test_panels_render_in_order_with_the_page_context(engine: Engine):
    register_panel(Panel("test.slot", "c.html", order=30))
    register_panel(Panel("test.slot", "a.html", order=10))
    register_panel(Panel("other.slot", "b.html", order=20))
    assert render(engine, "page.html", plan="p1") == "<main>[a p1]\n[c]</main>-"
    # Registering the same template again replaces it (a second ready() adds nothing).
    register_panel(Panel("test.slot", "a.html", order=40))
    assert render(engine, "page.html", plan="p1") == "<main>[c]\n[a p1]</main>-"


def test_a_panel_shows_when_its_condition_holds_and_adds_its_own_context(engine: Engine):
    register_panel(Panel("test.slot", "a.html", order=10,
                         when=lambda context: context["plan"] == "shown"))
    register_panel(Panel("test.slot", "b.html", order=20,
                         context=lambda context: {"note": f"for {context['plan']}"}))
    assert render(engine, "page.html", plan="shown") == "<main>[a shown]\n[b for shown]</main>-"
    # The panel's variables are its own: the page after it does not see them.
    assert render(engine, "page.html", plan="hidden") == "<main>[b for hidden]</main>-"


def test_a_gate_action_shows_on_the_checks_it_serves_at_their_stage(engine: Engine):
    register_panel(gate_action("evals.html", ("eval", 2), ("quality", 4), order=20))
    register_panel(gate_action("conformance.html", ("conformance", 1), order=10))
    checks = [SimpleNamespace(key=key) for key in ("conformance", "eval", "quality", "other")]
    assert render(engine, "gate.html", checks=checks, viewed_stage=1) == \
        "conformance:C;eval:;quality:;other:;"
    assert render(engine, "gate.html", checks=checks, viewed_stage=2) == \
        "conformance:;eval:E;quality:;other:;"
    assert render(engine, "gate.html", checks=checks, viewed_stage=4) == \
        "conformance:;eval:;quality:E;other:;"


def test_figures_come_from_the_provider_or_are_none(engine: Engine):
    assert render(engine, "live.html", pools=["a", "b"]) == "a=— b=— "
    register_provider("live", lambda pools: {name: name.upper() for name in pools[:1]})
    assert render(engine, "live.html", pools=["a", "b"]) == "a=A b=— "


def test_the_apps_register_the_panels_the_pages_showed_before_slots():
    """What plans, fleet and traffic pages show of the apps above them, in the order they
    showed it when they included those templates by name."""
    def templates(slot: str) -> list[str]:
        return [panel.template for panel in registry.panels_of(slot)]

    assert templates(PLAN_PANELS) == ["shadow/_plan_panel.html", "evals/_plan_panel.html",
                                      "batch/_plan_panel.html", "schedules/_plan_panel.html",
                                      "economics/_plan_panel.html"]
    assert templates(GATE_ACTION) == ["conformance/_gate_action.html",
                                      "conformance/_routing_gate_action.html",
                                      "shadow/_gate_action.html", "evals/_gate_action.html"]
    assert templates("pool.panels") == ["ramps/_pool_live.html", "telemetry/_pool_cost.html"]
    assert templates("route.panels") == ["ramps/_route_panels.html"]
    assert "fleet.pool_live" in registry.PROVIDERS
    assert "fleet.pool_cost" in registry.PROVIDERS
