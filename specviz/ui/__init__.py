"""The Gradio app: layout and handlers on top of the runner (models -> engine -> events -> render)."""
from .layout import build_app, launch_options
from .settings import Policy, Settings, hosted_policy, policy_from_env

__all__ = ["Policy", "Settings", "build_app", "hosted_policy", "launch_options", "policy_from_env"]
