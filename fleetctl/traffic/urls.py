from django.urls import path

from fleetctl.traffic import views

app_name = "traffic"
urlpatterns = [
    path("", views.route_list, name="routes"),
    path("routes/<slug:name>/", views.route_detail, name="route-detail"),
    path("routes/<slug:name>/ramp/", views.route_ramp, name="route-ramp"),
    path("routes/<slug:name>/drain/", views.route_drain, name="route-drain"),
    path("routes/<slug:name>/health-policy/", views.route_health_policy,
         name="route-health-policy"),
    path("routes/<slug:name>/reverify-policy/", views.route_reverify_policy,
         name="route-reverify-policy"),
    path("routes/<slug:name>/tiers/", views.route_tiers, name="route-tiers"),
    path("routes/<slug:name>/affinity/", views.route_affinity, name="route-affinity"),
    path("routes/<slug:name>/capacity/apply/", views.route_capacity_apply,
         name="route-capacity-apply"),
    path("pools/<slug:name>/drain/", views.pool_drain, name="pool-drain"),
    path("drains/", views.drain_list, name="drains"),
    path("drains/<int:drain_id>/", views.drain_detail, name="drain-detail"),
    path("drains/<int:drain_id>/restore/", views.drain_restore, name="drain-restore"),
]
