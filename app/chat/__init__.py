"""Chat widgets: conversation list, transcript view with Markdown, message composer."""
