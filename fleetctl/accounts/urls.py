from django.urls import path

from fleetctl.accounts import views

app_name = "accounts"
urlpatterns = [
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]
