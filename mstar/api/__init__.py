"""HTTP only: routes, schemas, limits, media encoding. No model logic."""
