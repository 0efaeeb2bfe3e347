"""The management REST API under ``/api/v1``: typed operations (declare.py), their
schemas (schemas.py), handlers (operations.py), who may call them (access.py),
and the Starlette routes with the generated OpenAPI 3.1 document (routes.py)."""
