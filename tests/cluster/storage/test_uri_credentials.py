"""Which URIs carry a credential (`cluster.storage.credentials_in`): a USER:PASSWORD@ part or a query parameter
whose name says it holds a secret, judged on whole words so that ordinary parameters pass. Plain, no server."""

from __future__ import annotations

import pytest

from cluster.storage.location import credentials_in, without_credentials

SECRET = [
    ("https://h/v1?key=abc", "its query's key"),
    ("https://h/v1?api_key=abc", "its query's api_key"),
    ("https://h/v1?x-api-key=abc", "its query's x-api-key"),
    ("https://h/v1?subscription-key=abc", "its query's subscription-key"),
    ("https://h/o?X-Amz-Signature=abc", "its query's X-Amz-Signature"),
    ("https://h/o?sessionToken=abc", "its query's sessionToken"),
    ("s3://b/runs?account_key=abc", "its query's account_key"),
    ("s3://b/runs?sig=abc", "its query's sig"),
    ("https://h/x?primaryKey=abc", "its query's primaryKey"),  # Azure's account keys
]
PLAIN = [
    "s3://b/runs?partition_key=day",
    "https://h/v1?sortKey=name",
    "https://h/v1?object-key=a/b",
    "https://h/v1?cache_key=x&max_tokens=4",
    "mongodb://h/db?authSource=admin",
    "https://h/v1?tokenizer=t&author=me",
    "hdfs://user@namenode/runs",
]


@pytest.mark.parametrize(("uri", "named"), SECRET)
def test_a_secret_query_parameter_is_named_and_its_value_never_quoted(uri, named):
    assert credentials_in(uri) == named
    assert "abc" not in without_credentials(uri)


@pytest.mark.parametrize("uri", PLAIN)
def test_parameters_that_only_look_like_secrets_pass(uri):
    assert credentials_in(uri) is None
    assert without_credentials(uri) == uri
