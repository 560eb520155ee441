from django.urls import path

from fleetctl.batch import views

app_name = "batch"
urlpatterns = [
    path("", views.job_list, name="list"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/action/", views.job_action, name="job-action"),
    path("jobs/<int:job_id>/edit/", views.job_edit, name="job-edit"),
    path("jobs/<int:job_id>/output.jsonl", views.job_output, name="job-output"),
    path("jobs/<int:job_id>/errors.jsonl", views.job_errors, name="job-errors"),
    path("soaks/<int:soak_id>/", views.soak_detail, name="soak-detail"),
    path("soaks/<int:soak_id>/stop/", views.soak_stop, name="soak-stop"),
    path("soaks/<int:soak_id>/edit/", views.soak_edit, name="soak-edit"),
    path("plans/<slug:plan>/soak/", views.soak_start, name="soak-start"),
]
