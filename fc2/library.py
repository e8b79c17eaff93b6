"""Library pages: one per bundle and dataset — what it is, which jobs used it — to rename or delete it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from fc2.models import CodeBundle, Dataset, is_platform_admin
from fc2.services import library

KINDS = {"bundle": CodeBundle, "dataset": Dataset}


def _items(request: HttpRequest, kind: str) -> QuerySet:
    # Someone else's bundle or dataset is a 404 (built-ins too: they have no page); admins see every one.
    items = KINDS[kind].objects.all()
    return items if is_platform_admin(request.user) else items.filter(owner=request.user)


def _item(request: HttpRequest, kind: str, pk: int):
    return get_object_or_404(_items(request, kind), pk=pk)


def _owned(request: HttpRequest, kind: str, pk: int):
    # Renaming and deleting are the owner's, even for an admin looking on.
    return get_object_or_404(KINDS[kind].objects.filter(owner=request.user), pk=pk)


def urls(kind: str) -> list:
    """`/bundles/<pk>/` (name `bundle`), its `rename/` and `delete/`; the same for datasets."""
    extra = {"kind": kind}
    return [
        path(f"{kind}s/<int:pk>/", detail, extra, name=kind),
        path(f"{kind}s/<int:pk>/rename/", rename, extra, name=f"{kind}-rename"),
        path(f"{kind}s/<int:pk>/delete/", delete, extra, name=f"{kind}-delete"),
    ]


@login_required
def detail(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    item = _item(request, kind, pk)
    context = {
        "kind": kind,
        "item": item,
        # Only the jobs the viewer may open; the count that refuses a delete is every job's.
        "jobs": item.jobs.visible_to(request.user).order_by("-created_at", "-pk"),
        "used_by": item.jobs.count(),
        "is_owner": item.owner_id == request.user.pk,
    }
    return render(request, "fc2/library_item.html", context)


@login_required
@require_POST
def rename(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    item = _owned(request, kind, pk)
    try:
        library.rename(item, request.POST.get("name", ""))
    except library.LibraryError as exc:
        messages.error(request, f"Not renamed: {exc}.")
    else:
        messages.success(request, f"Renamed to “{item.name}”.")
    return redirect(reverse(kind, args=[pk]))


@login_required
@require_POST
def delete(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    item = _owned(request, kind, pk)
    try:
        library.delete(item)
    except library.LibraryError as exc:
        messages.error(request, f"Not deleted: {exc}.")
        return redirect(reverse(kind, args=[pk]))
    messages.success(request, f"Deleted “{item.name}”.")
    return redirect(reverse("home") + f"#{kind}s")
