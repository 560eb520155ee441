from django.urls import include, path
from rest_framework.routers import DefaultRouter

from fleetctl.accounts.api.people import PersonViewSet, token_current
from fleetctl.accounts.api.views import ServiceTokenViewSet, TokenViewSet, me
from fleetctl.audit.api.views import AuditEventViewSet
from fleetctl.batch.api.soaks import SoakViewSet
from fleetctl.batch.api.views import BatchFileViewSet, BatchJobViewSet
from fleetctl.bench.api.views import RunViewSet, TraceViewSet
from fleetctl.conformance.api.views import ConformanceRunViewSet, RoutingProbeViewSet
from fleetctl.economics.api.views import BusinessCaseView, ReportView
from fleetctl.evals.api.views import EvalRunViewSet, EvalSuiteViewSet
from fleetctl.fleet.api.views import (
    CurrencyRateViewSet,
    HealthCheckViewSet,
    HealthTransitionViewSet,
    PoolModelViewSet,
    PoolViewSet,
    RegionViewSet,
)
from fleetctl.observability import MetricsView
from fleetctl.prometheus.api.views import (
    DashboardsMeasuredView,
    MetricSourceViewSet,
    PlanAlertRulesView,
    PlanDashboardView,
    PoolAlertRulesView,
    PoolDashboardView,
)
from fleetctl.ramps.api.views import RampViewSet, WatchViewSet
from fleetctl.schedules.api.views import ScheduleViewSet
from fleetctl.shadow.api.views import ShadowRunViewSet
from fleetctl.telemetry.api.views import IngestStatusViewSet, TelemetryPoolViewSet
from fleetctl.traffic.api.views import DrainViewSet, GatewayViewSet, PushViewSet, RouteViewSet
from fleetctl.webhooks.api.views import WebhookViewSet
from migrations_plan.api.views import (
    EvidenceKindViewSet,
    EvidenceRuleViewSet,
    EvidenceViewSet,
    PlanViewSet,
)

router = DefaultRouter()
router.register("regions", RegionViewSet, basename="region")
router.register("pools", PoolViewSet, basename="pool")
router.register("pool-models", PoolModelViewSet, basename="pool-model")
router.register("currency-rates", CurrencyRateViewSet, basename="currency-rate")
router.register("health-checks", HealthCheckViewSet, basename="health-check")
router.register("health-transitions", HealthTransitionViewSet, basename="health-transition")
router.register("audit-events", AuditEventViewSet, basename="audit-event")
router.register("routes", RouteViewSet, basename="route")
router.register("gateways", GatewayViewSet, basename="gateway")
router.register("pushes", PushViewSet, basename="push")
router.register("drains", DrainViewSet, basename="drain")
router.register("ramps", RampViewSet, basename="ramp")
router.register("watches", WatchViewSet, basename="watch")
router.register("bench/traces", TraceViewSet, basename="bench-trace")
router.register("bench/runs", RunViewSet, basename="bench-run")
router.register("conformance-runs", ConformanceRunViewSet, basename="conformance-run")
router.register("routing-probes", RoutingProbeViewSet, basename="routing-probe")
router.register("shadow-runs", ShadowRunViewSet, basename="shadow-run")
router.register("eval-suites", EvalSuiteViewSet, basename="eval-suite")
router.register("eval-runs", EvalRunViewSet, basename="eval-run")
router.register("plans", PlanViewSet, basename="plan")
router.register("evidence", EvidenceViewSet, basename="evidence")
router.register("evidence-kinds", EvidenceKindViewSet, basename="evidence-kind")
router.register("evidence-rules", EvidenceRuleViewSet, basename="evidence-rule")
router.register("tokens", TokenViewSet, basename="token")
router.register("service-tokens", ServiceTokenViewSet, basename="service-token")
router.register("people", PersonViewSet, basename="person")
router.register("telemetry/pools", TelemetryPoolViewSet, basename="telemetry-pool")
router.register("telemetry/ingest", IngestStatusViewSet, basename="telemetry-ingest")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("metric-sources", MetricSourceViewSet, basename="metric-source")
router.register("batch/files", BatchFileViewSet, basename="batch-file")
router.register("batch/jobs", BatchJobViewSet, basename="batch-job")
router.register("batch/soaks", SoakViewSet, basename="batch-soak")
router.register("schedules", ScheduleViewSet, basename="schedule")

urlpatterns = [
    path("me/", me, name="me"),
    path("tokens/current/", token_current, name="token-current"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("plans/<slug:name>/business-case/", BusinessCaseView.as_view(),
         name="plan-business-case"),
    path("plans/<slug:name>/report/", ReportView.as_view(), name="plan-report"),
    path("plans/<slug:name>/alert-rules/", PlanAlertRulesView.as_view(),
         name="plan-alert-rules"),
    path("plans/<slug:name>/dashboard/", PlanDashboardView.as_view(), name="plan-dashboard"),
    path("plans/<slug:name>/dashboards-measured/", DashboardsMeasuredView.as_view(),
         name="plan-dashboards-measured"),
    path("pools/<slug:name>/alert-rules/", PoolAlertRulesView.as_view(),
         name="pool-alert-rules"),
    path("pools/<slug:name>/dashboard/", PoolDashboardView.as_view(), name="pool-dashboard"),
    path("", include(router.urls)),
]
