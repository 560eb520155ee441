from __future__ import annotations

from typing import Any

from django import forms

from fleetctl.webhooks.models import EVENTS, Webhook


class WebhookForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="Lower-case letters, digits and dashes.")
    url = forms.CharField(max_length=500, label="URL",
                          help_text="Where deliveries are POSTed (http:// or https://).")
    events = forms.MultipleChoiceField(
        choices=[(name, f"{name}: {what}") for name, what in sorted(EVENTS.items())],
        required=False, widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every event.")
    format = forms.ChoiceField(choices=Webhook.Format.choices)
    secret = forms.CharField(
        max_length=200, required=False, widget=forms.PasswordInput(render_value=False),
        help_text="Signs each body (X-Fleetctl-Signature). Never shown again; leave empty "
                  "to keep the current one.")
    clear_secret = forms.BooleanField(required=False, label="Remove the secret")
    active = forms.BooleanField(required=False, initial=True)
    trusted = forms.BooleanField(
        required=False, label="Trusted receiver",
        help_text="Keep what the receiver answers (first 500 characters) for everyone who "
                  "reads deliveries. Untrusted: its status line only.")

    def __init__(self, *args: Any, editing: bool = False, can_trust: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not can_trust:
            # Only an administrator marks a receiver trusted (the service checks again).
            del self.fields["trusted"]
        if not editing:
            del self.fields["clear_secret"]
            self.fields["secret"].help_text = ("Signs each body (X-Fleetctl-Signature). "
                                               "Never shown again.")

    def changes(self) -> dict[str, Any]:
        """The service's keyword arguments: an empty secret field keeps the secret."""
        data = dict(self.cleaned_data)
        clear = data.pop("clear_secret", False)
        if clear:
            data["secret"] = ""
        elif not data.get("secret"):
            data.pop("secret", None)
        return data


class DeleteForm(forms.Form):
    confirm = forms.BooleanField(required=True, widget=forms.HiddenInput, initial=True)
