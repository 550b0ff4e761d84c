"""On-policy distillation's teachers (veRL 0.10's ``verl.experimental.teacher_loop``): servers and their client."""

from verl.experimental.teacher_loop.teacher_manager import AsyncTeacherLLMServerManager
from verl.experimental.teacher_loop.teacher_model import MultiTeacherModelManager

__all__ = ["AsyncTeacherLLMServerManager", "MultiTeacherModelManager"]
