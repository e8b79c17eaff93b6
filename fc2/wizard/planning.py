"""The cluster a wizard's answers get: the plan (recommendation) shown on the resource and review steps and run."""

from __future__ import annotations

from django.conf import settings

from fc2.services import jobs, pricing
from fc2.services.planning import Owner, Plan
from fc2.services.requests import JobRequest
from fc2.wizard.forms import ResourceForm
from fc2.wizard.state import Wizard
from recommender.types import RecommendationError

__all__ = ["planned", "preview"]


def planned(request: JobRequest, owner: Owner = None) -> Plan:
    """The request's cluster (`jobs.planned`), explore's weights and search budget checked first so that a fault of
    theirs is said beside its field before anything is planned (RecommendationError, SubmitError)."""
    jobs.check_search(request)
    return jobs.planned(request, owner)


def preview(wizard: Wizard, form: ResourceForm) -> dict:
    """The live recommendation for the resource fields of `form`: the plan and its estimate of the whole job's cost
    (pricing.estimate, as submit's budget check reckons it), or why there is none; with spot asked, the cluster's
    expected spot price beside on-demand (pricing.spot_saving), or why it is unknown."""
    if not form.is_valid():
        return {"invalid": form}
    if not wizard.reachable("resource"):
        return {"error": "Complete the Code and Data steps first: the recommendation is for your code and data."}
    try:
        request = wizard.job_request(form.state())
        plan = planned(request, wizard.user)
    except (RecommendationError, jobs.SubmitError) as exc:
        return {"error": str(exc)}
    return {
        "plan": plan,
        "job_request": request,
        "epochs": request.epochs,
        "estimate": plan.estimate(request.epochs),
        "spot": _spot_saving(plan, request) if request.spot and request.provider in jobs.SPOT_PROVIDERS else None,
    }


def _spot_saving(plan: Plan, request: JobRequest) -> pricing.SpotSaving:
    """The plan's cluster on spot beside on-demand: its workers and its PS node (a PS cluster's, on the workers'
    type where no PS type is named), in the request's region."""
    if plan.search:
        return pricing.SpotSaving(unknown="known once the search has chosen the cluster's types")
    nodes = {plan.worker_type: plan.workers} if plan.worker_type else {}
    if nodes and plan.strategy == "ps":
        ps = plan.ps_type or plan.worker_type
        nodes[ps] = nodes.get(ps, 0) + 1
    region = request.region or settings.FC2_AWS_REGION
    return pricing.spot_saving(nodes, request.catalog, region, request.spot_max_price)
