"""Structural schemas of the custom resources the chart renders, which kubernetes-validate has
no schema for: ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1, the Prometheus
operator) and Issuer and Certificate (cert-manager.io/v1).

Each is the subset of its CRD's OpenAPI schema that the chart uses, written out from the CRDs'
field names, types and enums, closed (``additionalProperties: false``) wherever the CRD is, so
that a misspelt or misplaced field fails as it would on a cluster.
"""

from __future__ import annotations

from typing import Any

import jsonschema

_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    r"(([0-9]+)ms)?)$",
}
"""A Prometheus duration, as the operator's CRDs pattern it."""
_STRING = {"type": "string"}
_STRINGS = {"type": "array", "items": _STRING}
_STRING_MAP = {"type": "object", "additionalProperties": _STRING}
_LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_METADATA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": _STRING,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "required": ["name", "namespace"],
    "additionalProperties": False,
}

_LABEL_SELECTOR = _closed(
    {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": _closed(
                {"key": _STRING, "operator": _STRING, "values": _STRINGS}, ("key", "operator")
            ),
        },
    }
)

_RELABEL = _closed(
    {
        "sourceLabels": {"type": "array", "items": _LABEL_NAME},
        "separator": _STRING,
        "targetLabel": _STRING,
        "regex": _STRING,
        "modulus": {"type": "integer"},
        "replacement": _STRING,
        "action": {
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ]
        },
    }
)

_SECRET_KEY = _closed({"name": _STRING, "key": _STRING, "optional": {"type": "boolean"}}, ("key",))

_TLS_CONFIG = _closed(
    {
        "ca": _closed({"secret": _SECRET_KEY, "configMap": _SECRET_KEY}),
        "cert": _closed({"secret": _SECRET_KEY, "configMap": _SECRET_KEY}),
        "keySecret": _SECRET_KEY,
        "serverName": _STRING,
        "insecureSkipVerify": {"type": "boolean"},
        "caFile": _STRING,
        "certFile": _STRING,
        "keyFile": _STRING,
    }
)

SERVICE_MONITOR = _closed(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": _closed(
            {
                "jobLabel": _STRING,
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": _closed({"any": {"type": "boolean"}, "matchNames": _STRINGS}),
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _closed(
                        {
                            "port": _STRING,
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "tlsConfig": _TLS_CONFIG,
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        }
                    ),
                },
            },
            ("selector", "endpoints"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

_RULE = {
    "oneOf": [
        _closed(
            {
                "alert": _STRING,
                "expr": {"type": ["string", "integer"]},
                "for": _DURATION,
                "keep_firing_for": _DURATION,
                "labels": _STRING_MAP,
                "annotations": _STRING_MAP,
            },
            ("alert", "expr"),
        ),
        _closed(
            {"record": _STRING, "expr": {"type": ["string", "integer"]}, "labels": _STRING_MAP},
            ("record", "expr"),
        ),
    ]
}

PROMETHEUS_RULE = _closed(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": _closed(
            {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": _closed(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": _STRING,
                            "rules": {"type": "array", "items": _RULE},
                        },
                        ("name",),
                    ),
                }
            }
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

_ISSUER_REF = _closed(
    {"name": _STRING, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": _STRING}, ("name",)
)

ISSUER = _closed(
    {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Issuer"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "properties": {"selfSigned": _closed({"crlDistributionPoints": _STRINGS})},
            "minProperties": 1,
            "maxProperties": 1,
        },
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

_USAGES = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
]

CERTIFICATE = _closed(
    {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": _METADATA,
        "spec": _closed(
            {
                "secretName": _STRING,
                "commonName": {"type": "string", "maxLength": 64},
                "dnsNames": _STRINGS,
                "ipAddresses": _STRINGS,
                "duration": _STRING,
                "renewBefore": _STRING,
                "isCA": {"type": "boolean"},
                "usages": {"type": "array", "items": {"enum": _USAGES}},
                "issuerRef": _ISSUER_REF,
            },
            ("secretName", "issuerRef"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
    ("cert-manager.io/v1", "Issuer"): ISSUER,
    ("cert-manager.io/v1", "Certificate"): CERTIFICATE,
}


def validate(doc: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` fits its kind's schema above."""
    schema = SCHEMAS[(doc["apiVersion"], doc["kind"])]
    jsonschema.Draft202012Validator(schema).validate(doc)
