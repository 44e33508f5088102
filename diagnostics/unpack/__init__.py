"""Archives unpacked under a byte budget (tar read header by header, zip checked from its
end-of-central-directory record), and upload names made safe: used by the analysis child
and the upload views alike, so it sits below both."""
