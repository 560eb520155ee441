from django.urls import path

from fleetctl.core.urls import job_run_urls
from fleetctl.evals import views

app_name = "evals"
urlpatterns = [
    path("", views.run_list, name="home"),
    path("suites/", views.suite_list, name="suites"),
    path("suites/<int:suite_id>/", views.suite_detail, name="suite-detail"),
    path("suites/<int:suite_id>/download/", views.suite_download, name="suite-download"),
    path("suites/<int:suite_id>/retire/", views.suite_retire, name="suite-retire"),
    *job_run_urls(views, create_name="run-new"),
]
