from django.urls import path

from fleetctl.prometheus import views

app_name = "metric_sources"
urlpatterns = [
    path("", views.source_list, name="list"),
    path("new/", views.source_create, name="create"),
    path("<slug:name>/", views.source_detail, name="detail"),
    path("<slug:name>/edit/", views.source_edit, name="edit"),
    path("<slug:name>/delete/", views.source_delete, name="delete"),
    path("<slug:name>/test/", views.source_test, name="test"),
]
