from django.urls import path

from fleetctl.accounts import people_views, views

app_name = "accounts"
urlpatterns = [
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    path("set-password/<uidb64>/<token>/", people_views.SetPasswordView.as_view(),
         name="set-password"),
]
