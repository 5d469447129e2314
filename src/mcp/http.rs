//! The daemon's `/mcp`: MCP's streamable HTTP transport (to come).
