from django.urls import path

from fleetctl.schedules import views

app_name = "schedules"
urlpatterns = [
    path("", views.schedule_list, name="list"),
    path("new/", views.schedule_create, name="create"),
    path("<int:schedule_id>/", views.schedule_detail, name="detail"),
    path("<int:schedule_id>/edit/", views.schedule_edit, name="edit"),
    path("<int:schedule_id>/toggle/", views.schedule_toggle, name="toggle"),
    path("<int:schedule_id>/delete/", views.schedule_delete, name="delete"),
]
