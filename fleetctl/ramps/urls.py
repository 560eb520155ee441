from django.urls import path

from fleetctl.ramps import views

app_name = "ramps"
urlpatterns = [
    path("", views.ramp_list, name="list"),
    path("<int:ramp_id>/", views.ramp_detail, name="detail"),
    path("<int:ramp_id>/action/", views.ramp_action, name="action"),
    path("start/<slug:route>/", views.ramp_start, name="start"),
    path("watches/<int:watch_id>/", views.watch_detail, name="watch"),
    path("watches/<int:watch_id>/action/", views.watch_action, name="watch-action"),
]
