"""The site's wiring: the engine a Django site configured, built from its settings.

- :mod:`.engines`: :func:`~aaa_django.site.engines.build_engine` (the site's
  database, blob storage and bus) and the handlers the settings name;
- :mod:`.host`: :class:`~aaa_django.site.host.EngineHost`, the web process's engine on
  a loop that outlives requests;
- :mod:`.llm_settings`: the model client ``AAA["LLM"]`` describes;
- :mod:`.mcp_settings`: the MCP servers ``AAA["MCP_SERVERS"]`` lists;
- :mod:`.tokens`: the live tokens ``AAA["STREAM_TOKENS"]`` turns on (where model
  handlers publish and event streams subscribe);
- :mod:`.blobs`: :class:`~aaa_django.site.blobs.StorageBlobStore`, blobs over any
  Django storage (S3 through django-storages).
"""
