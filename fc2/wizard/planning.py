"""The cluster a wizard's answers get: the plan (recommendation) shown on the resource and review steps and run."""

from __future__ import annotations

from fc2.services import jobs
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
    expected spot price beside on-demand, which the plan is priced at (`Plan.spot`), or why it is unknown."""
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
        "spot": plan.spot,
    }
