"""The OpenAI Batch API's paths (mounted at /openai/v1/ by fleetctl/urls.py; no trailing
slashes, as the official client asks)."""

from django.urls import path

from fleetctl.batch.api import openai

urlpatterns = [
    path("files", openai.FilesView.as_view(), name="openai-files"),
    path("files/<str:file_id>", openai.FileView.as_view(), name="openai-file"),
    path("files/<str:file_id>/content", openai.FileContentView.as_view(),
         name="openai-file-content"),
    path("batches", openai.BatchesView.as_view(), name="openai-batches"),
    path("batches/<str:batch_id>", openai.BatchView.as_view(), name="openai-batch"),
    path("batches/<str:batch_id>/cancel", openai.BatchCancelView.as_view(),
         name="openai-batch-cancel"),
]
