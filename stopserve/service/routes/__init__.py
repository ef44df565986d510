"""The service's routes: one APIRouter per resource, included by ``create_app``."""
