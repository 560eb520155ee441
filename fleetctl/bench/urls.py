from django.urls import path

from fleetctl.bench import views

app_name = "bench"
urlpatterns = [
    path("", views.bench_home, name="home"),
    # Before <name>/: "upload" and "generate" are forms, never traces.
    path("traces/upload/", views.trace_upload, name="trace-upload"),
    path("traces/generate/", views.trace_generate, name="trace-generate"),
    path("traces/<slug:name>/", views.trace_detail, name="trace-detail"),
    path("runs/new/", views.run_create, name="run-create"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
]
