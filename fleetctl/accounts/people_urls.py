from django.urls import path

from fleetctl.accounts import people_views

app_name = "people"
urlpatterns = [
    path("", people_views.people, name="list"),
    path("<str:username>/", people_views.person, name="detail"),
    path("<str:username>/active/", people_views.person_active, name="active"),
    path("<str:username>/set-password-link/", people_views.person_link, name="link"),
]
