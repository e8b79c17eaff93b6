from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated

from fc2 import accounts, api, dashboard, home, jobs_api, library, rest, views, wizard
from recommender import api as recommender_api
from recommender import views as recommender_views

# The REST API (docs/API.md), under its prefixes resolved first: a request to them is matched against the API's routes
# alone, and a page's request never against them. One route table, served as version 1 at /api/v1/ and, as v1's
# aliases, at the unversioned /api/ that clients and node agents of earlier releases still call. A change of a field's
# meaning makes a v2 with a table of its own; v1 keeps answering as it did.
api_urls = [
    path("jobs/<int:job_id>/report", api.ReportView.as_view(), name="api-job-report"),
    path("jobs/<int:job_id>/checkpoint", api.CheckpointView.as_view(), name="api-job-checkpoint"),
    path("me", api.MeView.as_view(), name="api-me"),
    path("recommend", recommender_api.RecommendView.as_view(), name="api-recommend"),
    # The jobs API; fc2/uploads.py knows the URL names of those that take files.
    path("bundles", jobs_api.BundlesView.as_view(), name="api-bundles"),
    path("bundles/<int:bundle_id>", jobs_api.BundleView.as_view(), name="api-bundle"),
    path("datasets", jobs_api.DatasetsView.as_view(), name="api-datasets"),
    path("datasets/<int:dataset_id>", jobs_api.DatasetView.as_view(), name="api-dataset"),
    path("jobs", jobs_api.JobsView.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>", jobs_api.JobView.as_view(), name="api-job"),
    path("jobs/<int:job_id>/logs", jobs_api.JobLogsView.as_view(), name="api-job-logs"),
    path("jobs/<int:job_id>/artifacts", jobs_api.JobArtifactsView.as_view(), name="api-job-artifacts"),
    path(
        "jobs/<int:job_id>/artifacts/<int:artifact_id>",
        jobs_api.ArtifactDownloadView.as_view(),
        name="api-job-artifact",
    ),
    path("jobs/<int:job_id>/cancel", jobs_api.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<int:job_id>/rerun", jobs_api.JobRerunView.as_view(), name="api-job-rerun"),
    # Any signed-in user (a session or a personal token): the API's shapes hold no secret, but they map the private
    # API, which anonymous visitors have no use for.
    path("schema", SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]), name="api-schema"),
    # The reference's page lives outside the API's prefix (a page, not JSON); its address under the API leads there.
    path("docs", RedirectView.as_view(pattern_name="api-docs"), name="api-docs-redirect"),
]

urlpatterns = [
    # The aliases first: Django's reverse() names the last of the routes that share a name, so the URLs the platform
    # writes (an artifact's download link, the schema's link) are v1's. No route of the table matches "v1/…", so a
    # versioned path passes the aliases by; the API's 404 comes after both.
    path("api/", include(api_urls)),
    path("api/v1/", include(api_urls)),
    re_path(r"^api/(?P<rest>.*)$", rest.no_such_endpoint),
    path("", home.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    # The API reference, readable in a browser (Swagger UI from the platform's own static files, under a bar back to
    # the site): a page, so a visitor who is not signed in is sent to the login page rather than answered with the
    # API's JSON 401.
    path(
        "api-docs/",
        login_required(SpectacularSwaggerView.as_view(url_name="api-schema", template_name="fc2/api_docs.html")),
        name="api-docs",
    ),
    # Before Django's own: the login page offers password reset only where mail can deliver a link (fc2.accounts).
    path("accounts/login/", accounts.LoginView.as_view(), name="login"),
    path("accounts/password_reset/", accounts.PasswordResetView.as_view(), name="password_reset"),
    path("accounts/password_reset/done/", accounts.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", wizard.start, name="job-new"),
    path("jobs/new/recommendation/", wizard.recommendation, name="job-new-recommendation"),
    path("jobs/new/<slug:step>/", wizard.step, name="job-new-step"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/live/", views.job_live, name="job-live"),
    path("jobs/<int:job_id>/series.json", views.job_series, name="job-series"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/artifacts/<int:artifact_id>/", views.artifact_download, name="artifact-download"),
    *library.urls("bundle"),
    *library.urls("dataset"),
    path("dashboard/", dashboard.dashboard_page, name="dashboard"),
    path("account/tokens/", accounts.tokens_page, name="account-tokens"),
    path("account/tokens/<int:token_id>/revoke/", accounts.revoke_token, name="account-token-revoke"),
    path("recommender/", recommender_views.anwar, name="recommender-anwar"),
    path("recommender/catalogs/", recommender_views.catalogs, name="recommender-catalogs"),
    path("recommender/records/", recommender_views.records, name="recommender-records"),
    path("admin/", admin.site.urls),
]
