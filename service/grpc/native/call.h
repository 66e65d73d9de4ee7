// bertserve's native transport, part three (included by transport.cc): the call objects gRPC drives, a
// unary call the transport holds until it is answered (its callbacks are in reactor.h) and a refusal.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>

// In the anonymous namespace of the one translation unit (transport.cc) that includes this.
namespace {

class Transport;

// One unary call: created when it arrives, deleted when gRPC is done with it.
class Call : public grpc::ServerGenericBidiReactor {
 public:
  Call(Transport* transport, grpc::CallbackServerContext* context, uint64_t id)
      : transport_(transport), context_(context), id_(id) {}
  void Begin();  // reads the request
  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // Called once, by whoever removed the call from the transport's table.
  void Reply(const uint8_t* data, size_t size) {
    grpc::Slice slice(data, size);
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void End(const grpc::Status& status) { Finish(status); }

 private:
  Transport* transport_;
  grpc::CallbackServerContext* context_;
  uint64_t id_;
  grpc::ByteBuffer request_, response_;
};

// A call ended at once (unknown method, no room, draining): never reaches the table.
class Refusal : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace
