"""URL patterns more than one app declares alike."""

from __future__ import annotations

from types import ModuleType

from django.urls import URLPattern, path


def job_run_urls(views: ModuleType, *, create_name: str = "run-create") -> list[URLPattern]:
    """An evidence job's run pages (bench, conformance, evals): start one, follow it, cancel
    it, from the app's `run_create`, `run_detail` and `run_cancel` views."""
    return [
        path("runs/new/", views.run_create, name=create_name),
        path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
        path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    ]
