from django.urls import path

from fleetctl.bench import views
from fleetctl.core.urls import job_run_urls

app_name = "bench"
urlpatterns = [
    path("", views.bench_home, name="home"),
    # Before <name>/: "upload" and "generate" are forms, never traces.
    path("traces/upload/", views.trace_upload, name="trace-upload"),
    path("traces/generate/", views.trace_generate, name="trace-generate"),
    path("traces/<slug:name>/", views.trace_detail, name="trace-detail"),
    *job_run_urls(views),
]
