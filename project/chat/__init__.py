"""The example site's chat page (``/chat/``): a person talks to the demo agent, a
ToolLoop conversation, through the REST API and its event stream (docs/conversations.md)."""
