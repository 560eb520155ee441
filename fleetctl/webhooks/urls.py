from django.urls import path

from fleetctl.webhooks import views

app_name = "webhooks"
urlpatterns = [
    path("", views.webhook_list, name="list"),
    path("new/", views.webhook_create, name="create"),
    path("<slug:name>/", views.webhook_detail, name="detail"),
    path("<slug:name>/edit/", views.webhook_edit, name="edit"),
    path("<slug:name>/delete/", views.webhook_delete, name="delete"),
    path("<slug:name>/test/", views.webhook_test, name="test"),
]
