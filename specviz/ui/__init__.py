"""The Gradio app: layout and handlers on top of the runner (models -> engine -> events -> render).
May import: every layer below it, serving (the serving view) among them.
"""
from .layout import build_app, launch_options
from .policy import Policy, hosted_policy, policy_from_env
from ..run.settings import Settings

__all__ = ["Policy", "Settings", "build_app", "hosted_policy", "launch_options", "policy_from_env"]
