from django.urls import path

app_name = "traffic"
urlpatterns: list = []  # filled by the traffic dashboard
