from django.urls import path

from fleetctl.shadow import views

app_name = "shadow"
urlpatterns = [
    path("", views.run_list, name="home"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/stop/", views.run_stop, name="run-stop"),
    path("runs/<int:run_id>/adjust/", views.run_adjust, name="run-adjust"),
    path("plans/<slug:name>/start/", views.plan_start, name="plan-start"),
]
