"""A Hugging Face dataset's features (column types, class names), as ``datasets`` records them.

Two places hold them, read in this order:

* the Parquet schema metadata key ``huggingface`` that ``datasets`` writes into every file, JSON:
  ``{"info": {"features": {"label": {"names": ["cat", "dog"], "_type": "ClassLabel"}, ...}}}``;
* the YAML front matter of the dataset card (``README.md``): ``dataset_info: {features: [{name: label,
  dtype: {class_label: {names: {'0': cat, '1': dog}}}}, ...]}`` (a list of such, one per config, each
  with its ``config_name``).

Only what the pack records is taken: the features as found, and each ``ClassLabel`` column's names (a
column of class indices, or a list of them). Pure functions of the metadata; nothing here reads a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

HF_METADATA_KEY = b"huggingface"


def features_from_schema(metadata: Mapping[bytes, bytes] | None) -> dict[str, Any] | None:
    """The ``features`` that ``datasets`` put in a Parquet file's schema metadata, or None."""
    raw = (metadata or {}).get(HF_METADATA_KEY)
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    features = info.get("info", {}).get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) else None


def class_names_from_schema(features: Mapping[str, Any]) -> dict[str, list[str]]:
    """Column -> class names, for each ``ClassLabel`` column (or a sequence of ``ClassLabel``)."""
    found = {}
    for column, feature in features.items():
        while isinstance(feature, dict) and feature.get("_type") in ("Sequence", "List", "LargeList"):
            feature = feature.get("feature")
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
            names = feature.get("names")
            if isinstance(names, list) and all(isinstance(name, str) for name in names):
                found[column] = names
    return found


def card_dataset_info(readme: str, config: str | None) -> dict[str, Any] | None:
    """The ``dataset_info`` of ``config`` (or the card's only one) in a dataset card's YAML front matter."""
    if not readme.startswith("---"):
        return None
    end = readme.find("\n---", 3)
    if end < 0:
        return None
    try:
        card = yaml.safe_load(readme[3:end])
    except yaml.YAMLError:  # a card it cannot parse: the schema metadata is the other source
        return None
    infos = card.get("dataset_info") if isinstance(card, dict) else None
    if isinstance(infos, dict):
        infos = [infos]
    if not isinstance(infos, list):
        return None
    found: list[dict[str, Any]] = [info for info in infos if isinstance(info, dict)]
    if len(found) == 1:
        return found[0]
    wanted = config or "default"
    return next((info for info in found if info.get("config_name") == wanted), None)


def class_names_from_card(info: Mapping[str, Any]) -> dict[str, list[str]]:
    """Column -> class names, for each ``class_label`` feature of a card's ``dataset_info``."""
    found = {}
    features = info.get("features")
    for feature in features if isinstance(features, list) else []:
        if not isinstance(feature, dict):
            continue
        dtype = feature.get("dtype")
        if dtype is None and isinstance(feature.get("sequence"), dict):
            dtype = feature["sequence"]  # a sequence of class labels: {sequence: {class_label: ...}}
        label = dtype.get("class_label") if isinstance(dtype, dict) else None
        names = label.get("names") if isinstance(label, dict) else None
        if isinstance(names, dict):  # {'0': cat, '1': dog}: by index
            try:
                names = [str(names[key]) for key in sorted(names, key=int)]
            except (TypeError, ValueError):
                continue
        if isinstance(names, list) and isinstance(feature.get("name"), str):
            found[feature["name"]] = [str(name) for name in names]
    return found
