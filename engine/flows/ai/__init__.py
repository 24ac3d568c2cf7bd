"""The AI behind follow-ups: classifier, writer and timing planner, behind one interface."""
