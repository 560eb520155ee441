"""Dated currency rates: read by everyone, written by platform leads and admins, validated with
messages a person can act on, audited; a page under Fleet lists and adds them."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import CurrencyRate

pytestmark = pytest.mark.django_db
URL = "/api/v1/currency-rates/"
EUR_USD = {"from_currency": "EUR", "to_currency": "USD", "rate": "1.08",
           "as_of": "2026-11-30", "source": "reference rate"}


def test_platform_leads_write_rates_everyone_reads_them(client_for):
    lead, viewer, oncall = (client_for("platform-lead"), client_for("viewer"),
                            client_for("on-call"))
    answer = lead.post(URL, EUR_USD, format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["text"] == "1.08 USD/EUR" and body["rate"] == "1.08000000"
    assert body["created_by"] == "platform-lead" and body["as_of"] == "2026-11-30"
    listed = viewer.get(URL).json()
    assert [r["text"] for r in listed["results"]] == ["1.08 USD/EUR"]
    for refused in (viewer, oncall):
        assert refused.post(URL, {**EUR_USD, "as_of": "2026-12-01"},
                            format="json").status_code == 403
        assert refused.delete(f"{URL}{body['id']}/").status_code == 403
    event = AuditEvent.objects.get(action="currency_rate.create", outcome="ok")
    assert event.actor == "platform-lead" and event.after["rate"] == "1.08000000"
    assert AuditEvent.objects.filter(action="currency_rate.create",
                                     outcome="denied").count() == 2
    changed = lead.patch(f"{URL}{body['id']}/", {"rate": "1.09"}, format="json")
    assert changed.status_code == 200 and changed.json()["text"] == "1.09 USD/EUR"
    assert AuditEvent.objects.get(action="currency_rate.update", outcome="ok").before == {
        "rate": "1.08000000"}
    assert lead.delete(f"{URL}{body['id']}/").status_code == 204
    assert AuditEvent.objects.filter(action="currency_rate.delete", outcome="ok").count() == 1
    assert not CurrencyRate.objects.exists()


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"to_currency": "EUR"}, "to_currency", "two different currencies"),
    ({"rate": "0"}, "rate", "greater than or equal to"),
    ({"rate": "-1.2"}, "rate", "greater than or equal to"),
    ({"rate": "lots"}, "rate", "valid number"),
    ({"from_currency": "XXX"}, "from_currency", "not a valid choice"),
    ({"as_of": "30/11/2026"}, "as_of", "wrong format"),
])
def test_bad_rates_are_refused_with_the_field_and_nothing_is_stored(client_for, change,
                                                                    field, says):
    answer = client_for("admin").post(URL, {**EUR_USD, **change}, format="json")
    assert answer.status_code == 400, answer.json()
    assert says in json.dumps(answer.json()), answer.json()
    assert field in json.dumps(answer.json())
    assert not CurrencyRate.objects.exists()


def test_a_second_rate_for_the_same_pair_and_day_or_its_inverse_is_refused(client_for):
    lead = client_for("platform-lead")
    assert lead.post(URL, EUR_USD, format="json").status_code == 201
    again = lead.post(URL, {**EUR_USD, "rate": "1.10"}, format="json")
    assert again.status_code == 400 and "change it instead" in json.dumps(again.json())
    inverse = lead.post(URL, {**EUR_USD, "from_currency": "USD", "to_currency": "EUR",
                              "rate": "0.92"}, format="json")
    assert inverse.status_code == 400 and "its inverse" in json.dumps(inverse.json())
    assert CurrencyRate.objects.count() == 1


def test_the_rates_page_lists_and_adds_rates_for_leads_only(make_user):
    lead, viewer = Client(), Client()
    lead.force_login(make_user("lena", "platform-lead"))
    viewer.force_login(make_user("vic", "viewer"))
    form = {**EUR_USD, "as_of": "2026-11-30"}
    refused = viewer.post("/currency-rates/", form)
    assert refused.status_code == 403 and not CurrencyRate.objects.exists()
    added = lead.post("/currency-rates/", form)
    assert added.status_code == 302
    page = viewer.get("/currency-rates/").content.decode()
    assert "1.08 USD/EUR" in page and "2026-11-30" in page and "reference rate" in page
    assert "<fieldset class=\"stacked\" disabled>" in page  # read-only for a viewer
    bad = lead.post("/currency-rates/", {**form, "to_currency": "EUR"})
    assert bad.status_code == 200  # the form again, with the error on it (as for every form)
    assert "A rate is between two different currencies." in bad.content.decode()
    assert CurrencyRate.objects.count() == 1
    assert 'href="/currency-rates/"' in viewer.get("/").content.decode()


def test_a_lead_deletes_a_rate_from_the_page_and_a_viewer_cannot(make_user, client_for):
    client_for("platform-lead").post(URL, EUR_USD, format="json")
    rate = CurrencyRate.objects.get()
    viewer, lead = Client(), Client()
    viewer.force_login(make_user("vic", "viewer"))
    lead.force_login(make_user("lena", "platform-lead"))
    assert "Delete" not in viewer.get("/currency-rates/").content.decode().split(
        'id="currency-rates"')[1].split("</table>")[0]
    refused = viewer.post(f"/currency-rates/{rate.pk}/delete/", follow=True)
    assert refused.status_code == 200 and CurrencyRate.objects.filter(pk=rate.pk).exists()
    done = lead.post(f"/currency-rates/{rate.pk}/delete/", follow=True).content.decode()
    assert "Deleted 1.08 USD/EUR as of 2026-11-30." in done
    assert not CurrencyRate.objects.exists()
    again = lead.post(f"/currency-rates/{rate.pk}/delete/", follow=True).content.decode()
    assert "That rate was already deleted." in again
