from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from django import forms

from fleetctl.accounts import roles

SCOPE_HELP = {
    "read": "read everything the API lists",
    "jobs": "start evidence jobs",
    "ramp": "change split weights",
    "drain": "drain and restore pools",
    "fleet": "register and edit pools, regions, models",
}


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="Where it is used, e.g. 'laptop CLI' or 'ramp bot staging'.",
    )
    scopes = forms.MultipleChoiceField(
        choices=[(scope, f"{scope} — {SCOPE_HELP.get(scope, '')}") for scope in roles.SCOPES],
        widget=forms.CheckboxSelectMultiple, initial=["read"],
        help_text="A token never does more than your roles allow, whatever its scopes.",
    )
    expires_at = forms.DateField(
        required=False, label="Expires after",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="The token works through the end of this day (UTC). Empty: no expiry.",
    )

    def expiry(self) -> datetime | None:
        """The end of the chosen day in UTC: the first moment the token no longer works."""
        day = self.cleaned_data.get("expires_at")
        if day is None:
            return None
        return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


ROLE_HELP = {
    roles.VIEWER: "reads everything",
    roles.ON_CALL: "also drains, restores, ramps and starts jobs",
    roles.PLATFORM_LEAD: "also registers pools and approves gates",
    roles.ADMIN: "everything, including people, roles and service tokens",
}
ROLE_CHOICES = [(role, f"{role} — {ROLE_HELP[role]}") for role in roles.ROLES]


class PersonInviteForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="What they sign in with, e.g. 'jdoe'.")
    email = forms.EmailField(max_length=254)
    roles = forms.MultipleChoiceField(
        choices=ROLE_CHOICES, widget=forms.CheckboxSelectMultiple, initial=[roles.VIEWER],
    )


class PersonRolesForm(forms.Form):
    roles = forms.MultipleChoiceField(
        choices=ROLE_CHOICES, widget=forms.CheckboxSelectMultiple, required=False,
        help_text="With no role a person can sign in but sees nothing.",
    )
