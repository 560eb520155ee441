from django.urls import path

from fleetctl.fleet import views

app_name = "fleet"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("pools/new/", views.pool_create, name="pool-create"),
    path("pools/<slug:name>/", views.pool_detail, name="pool-detail"),
    path("pools/<slug:name>/edit/", views.pool_edit, name="pool-edit"),
    path("pools/<slug:name>/delete/", views.pool_delete, name="pool-delete"),
    path("pools/<slug:name>/models/add/", views.pool_model_add, name="pool-model-add"),
    path(
        "pools/<slug:name>/models/<int:entry_id>/remove/",
        views.pool_model_remove,
        name="pool-model-remove",
    ),
    path("regions/", views.region_list, name="region-list"),
    path("regions/new/", views.region_create, name="region-create"),
    path("currency-rates/", views.currency_rates, name="currency-rates"),
    path("currency-rates/<int:rate_id>/delete/", views.currency_rate_delete,
         name="currency-rate-delete"),
]
