from django.urls import path

from migrations_plan import views

app_name = "plans"
urlpatterns = [
    path("", views.plan_board, name="board"),
    # Before <name>/: "new" is the form, never a plan.
    path("new/", views.plan_create, name="create"),
    path("<slug:name>/", views.plan_detail, name="detail"),
    path("<slug:name>/approve/", views.plan_approve, name="approve"),
    path("<slug:name>/advance/", views.plan_advance, name="advance"),
    path("<slug:name>/pause/", views.plan_pause, name="pause"),
    path("<slug:name>/resume/", views.plan_resume, name="resume"),
    path("<slug:name>/regress/", views.plan_regress, name="regress"),
    path("<slug:name>/abandon/", views.plan_abandon, name="abandon"),
    path("<slug:name>/rehearse-drain/", views.plan_rehearse, name="rehearse"),
    path("<slug:name>/checks/add/", views.check_add, name="check-add"),
    path("<slug:name>/checks/<int:check_id>/edit/", views.check_edit, name="check-edit"),
    path("<slug:name>/checks/<int:check_id>/remove/", views.check_remove, name="check-remove"),
    path("<slug:name>/checks/<int:check_id>/attest/", views.check_attest, name="check-attest"),
]
