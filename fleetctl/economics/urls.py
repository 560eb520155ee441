from django.urls import path

from fleetctl.economics import views

app_name = "economics"
urlpatterns = [
    path("<slug:name>/business-case/", views.business_case_page, name="business-case"),
    path("<slug:name>/report/", views.report_page, name="report"),
    path("<slug:name>/report.pdf", views.report_pdf, name="report-pdf"),
]
