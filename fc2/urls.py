from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import IsAuthenticated

from fc2 import accounts, api, dashboard, home, library, views, wizard
from recommender import api as recommender_api
from recommender import views as recommender_views

urlpatterns = [
    path("", home.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
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
    path("api/jobs/<int:job_id>/report", api.ReportView.as_view(), name="api-job-report"),
    path("api/me", api.MeView.as_view(), name="api-me"),
    path("api/recommend", recommender_api.RecommendView.as_view(), name="api-recommend"),
    # Any signed-in user: researchers call /api/recommend and /api/me and need their shapes; it holds no secret, but it
    # maps the private API, which anonymous visitors have no use for.
    path("api/schema", SpectacularAPIView.as_view(permission_classes=[IsAuthenticated]), name="api-schema"),
    path("recommender/", recommender_views.anwar, name="recommender-anwar"),
    path("recommender/catalogs/", recommender_views.catalogs, name="recommender-catalogs"),
    path("recommender/records/", recommender_views.records, name="recommender-records"),
    path("admin/", admin.site.urls),
]
