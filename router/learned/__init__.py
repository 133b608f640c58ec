"""Learned models the service applies: the task classifier, features, and fitted estimators."""
