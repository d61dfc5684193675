"""Scikit-learn (and LightGBM / XGBoost / CatBoost) estimator names by family: what the
featurizer counts and the code reader treats as a model a script fits.

Constant: :data:`ESTIMATOR_FAMILIES`.

>>> "LGBMClassifier" in ESTIMATOR_FAMILIES["boosting"]
True
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ESTIMATOR_FAMILIES"]

ESTIMATOR_FAMILIES: Mapping[str, frozenset[str]] = {
    "linear": frozenset(
        "LogisticRegression LogisticRegressionCV LinearRegression Ridge RidgeCV RidgeClassifier RidgeClassifierCV "
        "Lasso LassoCV ElasticNet ElasticNetCV SGDClassifier SGDRegressor LinearSVC LinearSVR BayesianRidge "
        "HuberRegressor Perceptron PassiveAggressiveClassifier PoissonRegressor TweedieRegressor QuantileRegressor".split()
    ),
    "tree": frozenset("DecisionTreeClassifier DecisionTreeRegressor ExtraTreeClassifier ExtraTreeRegressor".split()),
    "forest": frozenset(
        "RandomForestClassifier RandomForestRegressor ExtraTreesClassifier ExtraTreesRegressor BaggingClassifier BaggingRegressor".split()
    ),
    "boosting": frozenset(
        "GradientBoostingClassifier GradientBoostingRegressor HistGradientBoostingClassifier HistGradientBoostingRegressor "
        "AdaBoostClassifier AdaBoostRegressor XGBClassifier XGBRegressor LGBMClassifier LGBMRegressor "
        "CatBoostClassifier CatBoostRegressor".split()
    ),
    "knn": frozenset(
        "KNeighborsClassifier KNeighborsRegressor RadiusNeighborsClassifier RadiusNeighborsRegressor NearestCentroid".split()
    ),
    "svm": frozenset("SVC SVR NuSVC NuSVR".split()),
    "naive_bayes": frozenset("GaussianNB MultinomialNB BernoulliNB ComplementNB CategoricalNB".split()),
    "neural": frozenset("MLPClassifier MLPRegressor".split()),
    "dummy": frozenset("DummyClassifier DummyRegressor".split()),
    "meta": frozenset(
        "VotingClassifier VotingRegressor StackingClassifier StackingRegressor OneVsRestClassifier CalibratedClassifierCV".split()
    ),
    "discriminant": frozenset("LinearDiscriminantAnalysis QuadraticDiscriminantAnalysis".split()),
    "gaussian_process": frozenset("GaussianProcessClassifier GaussianProcessRegressor".split()),
}
