from django.urls import path

from fleetctl.conformance import views

app_name = "conformance"
urlpatterns = [
    path("", views.run_list, name="home"),
    path("runs/new/", views.run_create, name="run-create"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("plans/<slug:name>/run/", views.plan_run, name="plan-run"),
]
