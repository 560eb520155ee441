from django.urls import path

from fleetctl.evals import views

app_name = "evals"
urlpatterns = [
    path("", views.run_list, name="home"),
    path("suites/", views.suite_list, name="suites"),
    path("suites/<int:suite_id>/", views.suite_detail, name="suite-detail"),
    path("suites/<int:suite_id>/download/", views.suite_download, name="suite-download"),
    path("suites/<int:suite_id>/retire/", views.suite_retire, name="suite-retire"),
    path("runs/new/", views.run_create, name="run-new"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
]
