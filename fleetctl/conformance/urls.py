from django.urls import path

from fleetctl.conformance import views
from fleetctl.core.urls import job_run_urls

app_name = "conformance"
urlpatterns = [
    path("", views.run_list, name="home"),
    *job_run_urls(views),
    path("plans/<slug:name>/run/", views.plan_run, name="plan-run"),
    path("plans/<slug:name>/routing-probe/", views.plan_routing_probe,
         name="plan-routing-probe"),
    path("routing-probes/<int:probe_id>/", views.routing_probe_detail,
         name="routing-probe-detail"),
]
