"""What the uploads in parts answer."""

from __future__ import annotations

from pydantic import BaseModel, Field


class UploadState(BaseModel):
    """How much of an upload the server holds: the next part starts at ``received``."""

    digest: str = Field(description="The upload's name: a document's sha256, a tensor's hash")
    kind: str = Field(description="document or values")
    total: int = Field(description="The whole upload's bytes")
    received: int = Field(description="Bytes the server holds, from offset 0")
    complete: bool = Field(description="Every byte is held (values: checked and stored)")
