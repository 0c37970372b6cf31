pub mod pb {
    tonic::include_proto!("textgen.shard.v1");
}
