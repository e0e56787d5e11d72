"""One module per runtime/graph compiler, each exposing ``prepare(request, inputs) -> Session``."""
