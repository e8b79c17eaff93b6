from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from fc2 import api, dashboard, home, views, wizard
from recommender import api as recommender_api
from recommender import views as recommender_views

urlpatterns = [
    path("", home.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
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
    path("dashboard/", dashboard.dashboard_page, name="dashboard"),
    path("api/jobs/<int:job_id>/report", api.report, name="api-job-report"),
    path("api/me", api.MeView.as_view(), name="api-me"),
    path("api/recommend", recommender_api.RecommendView.as_view(), name="api-recommend"),
    path("api/schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("recommender/", recommender_views.anwar, name="recommender-anwar"),
    path("recommender/catalogs/", recommender_views.catalogs, name="recommender-catalogs"),
    path("recommender/records/", recommender_views.records, name="recommender-records"),
    path("admin/", admin.site.urls),
]
