from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("", include("fleetctl.fleet.urls")),
    path("plans/", include("migrations_plan.urls")),
    path("traffic/", include("fleetctl.traffic.urls")),
    path("bench/", include("fleetctl.bench.urls")),
    path("conformance/", include("fleetctl.conformance.urls")),
    path("shadow/", include("fleetctl.shadow.urls")),
    path("evals/", include("fleetctl.evals.urls")),
    path("ramps/", include("fleetctl.ramps.urls")),
    path("batch/", include("fleetctl.batch.urls")),
    path("schedules/", include("fleetctl.schedules.urls")),
    path("plans/", include("fleetctl.economics.urls")),
    path("audit/", include("fleetctl.audit.urls")),
    path("webhooks/", include("fleetctl.webhooks.urls")),
    path("metric-sources/", include("fleetctl.prometheus.urls")),
    path("account/", include("fleetctl.accounts.urls")),
    path("people/", include("fleetctl.accounts.people_urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(("fleetctl.api_urls", "api"), namespace="api")),
    # The OpenAI Batch API (the official client's base_url is http://host/openai/v1).
    path("openai/v1/", include("fleetctl.batch.openai_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
]
# Under /api/ a path no URL matches is answered in the API's error shape, not an HTML page.
handler404 = "fleetctl.core.views.not_found"
# The 500 page names the request's id (a browser user cannot see the response header).
handler500 = "fleetctl.core.views.server_error"
