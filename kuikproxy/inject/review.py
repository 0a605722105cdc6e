"""The ``AdmissionReview`` envelope (``admission.k8s.io/v1``): read a request, write a response.

Pure, like :mod:`.patch`. A body that is not a v1 ``AdmissionReview`` with a request and its
``uid`` cannot be answered at all: :class:`ReviewError`, which the edge answers ``400`` (the
API server then applies the webhook's ``failurePolicy``). Anything else is answered
``allowed: true``, with the patch or without it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from kuikproxy.errors import KuikProxyError
from kuikproxy.inject.patch import JSON, Injection, SidecarSettings, plan

__all__ = ["Review", "ReviewError", "admit", "parse", "response"]

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class ReviewError(KuikProxyError):
    """The body is not an ``AdmissionReview`` this webhook can answer; the message says why."""


@dataclass(frozen=True, slots=True)
class Review:
    """The parts of an admission request the webhook reads."""

    uid: str
    operation: JSON
    kind: JSON
    """``request.kind``: group, version and kind of the object."""
    namespace: JSON
    object: JSON


def parse(body: bytes) -> Review:
    """Read an ``AdmissionReview`` request; :class:`ReviewError` if it is not one."""
    try:
        document = json.loads(body)
    except (RecursionError, ValueError) as error:  # a decoding error is a ValueError
        raise ReviewError(f"the body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ReviewError("the body is not a JSON object")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise ReviewError(
            f"expected an {KIND} of apiVersion {API_VERSION} "
            "(the webhook's admissionReviewVersions must be [v1])"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise ReviewError(f"the {KIND} has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(f"the {KIND}'s request has no uid")
    return Review(
        uid=uid,
        operation=request.get("operation"),
        kind=request.get("kind"),
        namespace=request.get("namespace"),
        object=request.get("object"),
    )


def admit(review: Review, settings: SidecarSettings) -> Injection:
    """What to answer: pods being created are injected (:func:`.patch.plan`); other operations
    pass untouched (a pod's containers cannot change after creation); another kind of object
    passes with a warning, since it means the webhook's rules reach further than pods."""
    if review.kind != {"group": "", "version": "v1", "kind": "Pod"}:
        return Injection(warnings=("kuikproxy: only Pods are injected; check the webhook's rules",))
    if review.operation != "CREATE":
        return Injection()
    return plan(review.object, settings)


def response(uid: str, injection: Injection) -> dict[str, Any]:
    """The ``AdmissionReview`` answering request ``uid``: always allowed."""
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if injection.patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(
            json.dumps(injection.patch, separators=(",", ":")).encode()
        ).decode("ascii")
    if injection.warnings:
        answer["warnings"] = list(injection.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}
